//! Conformance of the stand-in API server (`tessera-sim apiserver`) with the
//! real kube-rs client: every verb through `kube::Api`, the Status errors
//! clients branch on (404, 409, 410, 413, 415, 422, 400), selectors,
//! pagination, binding, graceful pod deletion, finalizers, status
//! subresources, the three patch types, namespace deletion, `watcher` +
//! `reflector` across a restart, a crash (SIGKILL) and a forced 410, a
//! watcher falling behind the window, concurrent compare-and-swap writers,
//! and raw HTTP abuse the server must survive.
//!
//! Each test starts its own stand-in (a child process), so they run in
//! parallel. Expected values come from the Kubernetes API conventions (the
//! message shapes client-go and kubectl print), not from the stand-in's code.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Node, Pod};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions, WatchEvent,
    WatchParams,
};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::{Value, json};
use tessera_test_support::kube::{self as standin, StandInApiServer};
use tessera_test_support::{free_port, require};

/// A stand-in with extra arguments, or `None` (skipped loudly) when
/// `tessera-sim` is not built.
fn stand_in(extra: &[&str]) -> Option<StandInApiServer> {
    let Ok(()) = require(&[tessera_test_support::Need::Built("tessera-sim")]) else {
        return None;
    };
    Some(StandInApiServer::start(extra).expect("starting the stand-in API server"))
}

async fn client(server: &StandInApiServer) -> kube::Client {
    standin::client(server.kubeconfig())
        .await
        .expect("kube client")
}

/// A port free now, so a restarted stand-in keeps its URL.
/// A stand-in a restart brings back as it was: its state in a file (in the
/// directory, first) and a fixed `host:port` to listen on (second).
fn restartable_stand_in(
    extra: &[&str],
) -> Result<Option<(tempfile::TempDir, String, StandInApiServer)>> {
    let dir = tempfile::tempdir()?;
    let state = dir.path().join("state.json");
    let listen = format!("127.0.0.1:{}", free_port());
    let mut args = vec![
        "--state",
        state.to_str().context("path")?,
        "--listen",
        &listen,
    ];
    args.extend_from_slice(extra);
    let Some(server) = stand_in(&args) else {
        return Ok(None);
    };
    Ok(Some((dir, listen, server)))
}

/// The Status of a failed call (panics on success or a non-API error).
fn api_status<T: std::fmt::Debug>(result: kube::Result<T>) -> kube::core::Status {
    match result {
        Err(kube::Error::Api(status)) => *status,
        other => panic!("expected an API error Status, got {other:?}"),
    }
}

fn cm(name: &str, labels: &[(&str, &str)], data: &[(&str, &str)]) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>()},
        "data": data.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>(),
    }))
    .expect("configmap")
}

fn pod(name: &str, labels: &[(&str, &str)]) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>()},
        "spec": {"containers": [
            {"name": "main", "image": "busybox:1.36", "env": [{"name": "A", "value": "1"}]},
            {"name": "side", "image": "busybox:1.36"}
        ]},
    }))
    .expect("pod")
}

async fn bind(pods: &Api<Pod>, name: &str, node: &str) -> kube::Result<Value> {
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                         "target": {"apiVersion": "v1", "kind": "Node", "name": node}});
    pods.create_subresource("binding", name, &PostParams::default(), &binding)
        .await
}

/// Waits until `check` holds, polling; fails with `what` after `timeout`.
async fn eventually<F: FnMut() -> bool>(what: &str, timeout: Duration, mut check: F) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while !check() {
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_verb_through_kube_api() -> Result<()> {
    let Some(server) = stand_in(&[]) else {
        return Ok(());
    };
    let client = client(&server).await;

    // Namespaces: the defaults exist; a new one can be made and removed with its objects.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let names: Vec<String> = namespaces
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    for want in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        assert!(
            names.iter().any(|n| n == want),
            "namespace {want} missing from {names:?}"
        );
    }
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "verbs"}}))?;
    let created = namespaces.create(&PostParams::default(), &ns).await?;
    assert_eq!(
        created.status.and_then(|s| s.phase).as_deref(),
        Some("Active")
    );

    // ConfigMaps: create, get, list, replace, patch, delete, deletecollection.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "verbs");
    let a = cms
        .create(
            &PostParams::default(),
            &cm("a", &[("k", "1")], &[("x", "1")]),
        )
        .await?;
    let rv_a: u64 = a.metadata.resource_version.clone().context("rv")?.parse()?;
    assert!(
        a.metadata.uid.as_deref().is_some_and(|u| u.len() == 36),
        "uid {:?}",
        a.metadata.uid
    );
    assert!(a.metadata.creation_timestamp.is_some());
    let b = cms
        .create(&PostParams::default(), &cm("b", &[("k", "2")], &[]))
        .await?;
    let rv_b: u64 = b.metadata.resource_version.clone().context("rv")?.parse()?;
    assert!(rv_b > rv_a, "one global counter: {rv_b} after {rv_a}");
    let generated = cms
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"generateName": "gen-"}}))?,
        )
        .await?;
    let generated_name = generated.metadata.name.clone().context("name")?;
    assert!(
        generated_name.starts_with("gen-") && generated_name.len() > 4,
        "{generated_name}"
    );

    assert_eq!(cms.get("a").await?.data.context("data")?["x"], "1");
    let list = cms.list(&ListParams::default()).await?;
    assert_eq!(list.items.len(), 3);
    let list_rv: u64 = list.metadata.resource_version.context("list rv")?.parse()?;
    assert!(list_rv >= rv_b);

    let mut a2 = cms.get("a").await?;
    a2.data
        .get_or_insert_with(Default::default)
        .insert("x".into(), "2".into());
    let replaced = cms.replace("a", &PostParams::default(), &a2).await?;
    assert_eq!(replaced.data.context("data")?["x"], "2");
    let patched = cms
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"y": "3"}})),
        )
        .await?;
    assert_eq!(patched.data.as_ref().context("data")?.len(), 2);

    let deleted = cms.delete("b", &DeleteParams::default()).await?;
    assert!(
        deleted.is_left(),
        "a ConfigMap is deleted at once and returned"
    );
    assert_eq!(api_status(cms.get("b").await).code, 404);
    let removed = cms
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels("k=1"),
        )
        .await?;
    let removed = removed.left().context("a list of what was removed")?;
    assert_eq!(removed.items.len(), 1);
    assert_eq!(
        cms.list(&ListParams::default()).await?.items.len(),
        1,
        "only the generated one left"
    );

    // Leases (coordination.k8s.io/v1).
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let lease: Lease = serde_json::from_value(
        json!({"metadata": {"name": "n1"}, "spec": {"holderIdentity": "n1", "leaseDurationSeconds": 40}}),
    )?;
    leases.create(&PostParams::default(), &lease).await?;
    let renewed = leases
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"renewTime": "2025-01-01T00:00:00.000000Z"}})),
        )
        .await?;
    assert!(renewed.spec.and_then(|s| s.renew_time).is_some());

    // Events, selected by the object they are about.
    let events: Api<Event> = Api::namespaced(client.clone(), "verbs");
    let event: Event = serde_json::from_value(json!({
        "metadata": {"name": "e1"}, "reason": "Tested", "type": "Normal", "message": "hello",
        "involvedObject": {"kind": "Pod", "name": "p1", "namespace": "verbs"}}))?;
    events.create(&PostParams::default(), &event).await?;
    let about_p1 = events
        .list(&ListParams::default().fields("involvedObject.name=p1,reason=Tested"))
        .await?;
    assert_eq!(about_p1.items.len(), 1);
    assert!(
        events
            .list(&ListParams::default().fields("involvedObject.name=p2"))
            .await?
            .items
            .is_empty()
    );

    // Nodes (cluster-scoped).
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node =
        serde_json::from_value(json!({"metadata": {"name": "n1", "labels": {"zone": "a"}}}))?;
    nodes.create(&PostParams::default(), &node).await?;
    assert_eq!(
        nodes
            .list(&ListParams::default().labels("zone=a"))
            .await?
            .items
            .len(),
        1
    );

    // Deleting the namespace removes what is in it.
    namespaces.delete("verbs", &DeleteParams::default()).await?;
    assert_eq!(api_status(namespaces.get("verbs").await).code, 404);
    let left = Api::<ConfigMap>::all(client.clone())
        .list(&ListParams::default().fields("metadata.namespace=verbs"))
        .await?;
    assert!(
        left.items.is_empty(),
        "objects of a deleted namespace are gone"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_resource_version_is_409_conflict() -> Result<()> {
    let Some(server) = stand_in(&[]) else {
        return Ok(());
    };
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&server).await);
    let first = cms
        .create(&PostParams::default(), &cm("c", &[], &[("v", "1")]))
        .await?;
    cms.patch(
        "c",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"v": "2"}})),
    )
    .await?;

    let status = api_status(cms.replace("c", &PostParams::default(), &first).await);
    assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        status.message,
        "Operation cannot be fulfilled on configmaps \"c\": the object has been modified; please apply your changes to the latest version and try again"
    );
    // A patch that names a stale version conflicts too; one that names none does not.
    let stale_patch = json!({"metadata": {"resourceVersion": first.metadata.resource_version}, "data": {"v": "3"}});
    assert_eq!(
        api_status(
            cms.patch("c", &PatchParams::default(), &Patch::Merge(stale_patch))
                .await
        )
        .code,
        409
    );
    // PUT without a resourceVersion is unconditional.
    let mut blind = first.clone();
    blind.metadata.resource_version = None;
    blind.data = Some(BTreeMap::from([("v".to_owned(), "4".to_owned())]));
    assert_eq!(
        cms.replace("c", &PostParams::default(), &blind)
            .await?
            .data
            .context("data")?["v"],
        "4"
    );
    // A delete precondition on the old version conflicts.
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: first.metadata.resource_version.clone(),
            uid: None,
        }),
        ..DeleteParams::default()
    };
    assert_eq!(api_status(cms.delete("c", &dp).await).code, 409);
    assert!(
        cms.get("c").await.is_ok(),
        "a failed precondition deletes nothing"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_statuses_with_the_real_codes() -> Result<()> {
    let Some(server) = stand_in(&[]) else {
        return Ok(());
    };
    let client = client(&server).await;
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());

    let missing = api_status(cms.get("nope").await);
    assert_eq!((missing.code, missing.reason.as_str()), (404, "NotFound"));
    assert_eq!(missing.message, "configmaps \"nope\" not found");

    let bad_name = api_status(
        cms.create(&PostParams::default(), &cm("Not_A_Name", &[], &[]))
            .await,
    );
    assert_eq!((bad_name.code, bad_name.reason.as_str()), (422, "Invalid"));
    assert!(
        bad_name
            .message
            .starts_with("ConfigMap \"Not_A_Name\" is invalid: metadata.name: Invalid value"),
        "{}",
        bad_name.message
    );
    let causes = bad_name.details.context("details")?.causes;
    assert_eq!(
        causes.first().map(|c| c.field.as_str()),
        Some("metadata.name")
    );

    let dup = api_status(
        cms.create(&PostParams::default(), &cm("x", &[], &[]))
            .await
            .and(cms.create(&PostParams::default(), &cm("x", &[], &[])).await),
    );
    assert_eq!((dup.code, dup.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(dup.message, "configmaps \"x\" already exists");

    let elsewhere: Api<ConfigMap> = Api::namespaced(client.clone(), "nowhere");
    let no_ns = api_status(
        elsewhere
            .create(&PostParams::default(), &cm("x", &[], &[]))
            .await,
    );
    assert_eq!(
        (no_ns.code, no_ns.message.as_str()),
        (404, "namespaces \"nowhere\" not found")
    );

    let mut with_rv = cm("with-rv", &[], &[]);
    with_rv.metadata.resource_version = Some("12".into());
    let with_rv = api_status(cms.create(&PostParams::default(), &with_rv).await);
    assert_eq!(
        (with_rv.code, with_rv.message.as_str()),
        (
            400,
            "resourceVersion should not be set on objects to be created"
        )
    );

    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let empty_pod: Pod =
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {"containers": []}}))?;
    let invalid = api_status(pods.create(&PostParams::default(), &empty_pod).await);
    assert_eq!(invalid.code, 422);
    assert!(
        invalid.message.contains("spec.containers: Required value"),
        "{}",
        invalid.message
    );

    let unsupported = api_status(
        cms.list(&ListParams::default().fields("spec.nodeName=n1"))
            .await,
    );
    assert_eq!(
        (unsupported.code, unsupported.message.as_str()),
        (400, "field label not supported: spec.nodeName")
    );
    let bad_labels = api_status(cms.list(&ListParams::default().labels("a in b")).await);
    assert_eq!(bad_labels.code, 400);

    let missing_patch = api_status(
        cms.patch(
            "ghost",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {}})),
        )
        .await,
    );
    assert_eq!(missing_patch.code, 404);

    let apply = api_status(
        cms.patch(
            "x",
            &PatchParams::apply("test"),
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap"})),
        )
        .await,
    );
    assert_eq!(
        (apply.code, apply.reason.as_str()),
        (415, "UnsupportedMediaType")
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selectors_filter_lists() -> Result<()> {
    let Some(server) = stand_in(&[]) else {
        return Ok(());
    };
    let client = client(&server).await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    for (name, app, tier) in [
        ("w1", "web", "front"),
        ("w2", "web", "back"),
        ("d1", "db", "back"),
        ("x1", "misc", ""),
    ] {
        let mut labels = vec![("app", app)];
        if !tier.is_empty() {
            labels.push(("tier", tier));
        }
        pods.create(&PostParams::default(), &pod(name, &labels))
            .await?;
    }
    bind(&pods, "w1", "n1").await?;
    bind(&pods, "d1", "n2").await?;
    pods.patch_status(
        "d1",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running"}})),
    )
    .await?;

    let names = |lp: ListParams| {
        let pods = pods.clone();
        async move {
            let mut n: Vec<String> = pods
                .list(&lp)
                .await
                .expect("list")
                .items
                .into_iter()
                .filter_map(|p| p.metadata.name)
                .collect();
            n.sort();
            n
        }
    };
    assert_eq!(
        names(ListParams::default().labels("app=web")).await,
        ["w1", "w2"]
    );
    assert_eq!(
        names(ListParams::default().labels("app!=web")).await,
        ["d1", "x1"]
    );
    assert_eq!(
        names(ListParams::default().labels("app in (web,db),tier=back")).await,
        ["d1", "w2"]
    );
    assert_eq!(
        names(ListParams::default().labels("app notin (web)")).await,
        ["d1", "x1"]
    );
    assert_eq!(names(ListParams::default().labels("!tier")).await, ["x1"]);
    assert_eq!(
        names(ListParams::default().labels("tier")).await,
        ["d1", "w1", "w2"]
    );
    assert_eq!(
        names(ListParams::default().fields("spec.nodeName=n1")).await,
        ["w1"]
    );
    assert_eq!(
        names(ListParams::default().fields("spec.nodeName=")).await,
        ["w2", "x1"],
        "unscheduled pods"
    );
    assert_eq!(
        names(ListParams::default().fields("status.phase=Running")).await,
        ["d1"]
    );
    assert_eq!(
        names(ListParams::default().fields("status.phase!=Running,metadata.name!=x1")).await,
        ["w1", "w2"]
    );
    assert_eq!(
        names(
            ListParams::default()
                .fields("spec.schedulerName=default-scheduler")
                .labels("app=db")
        )
        .await,
        ["d1"]
    );
    let all_ns: Api<Pod> = Api::all(client);
    assert_eq!(
        all_ns
            .list(&ListParams::default().fields("metadata.namespace=default"))
            .await?
            .items
            .len(),
        4
    );
    assert!(
        all_ns
            .list(&ListParams::default().fields("metadata.namespace=kube-system"))
            .await?
            .items
            .is_empty()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pagination_with_limit_and_continue() -> Result<()> {
    let Some(server) = stand_in(&[]) else {
        return Ok(());
    };
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&server).await);
    let mut want: Vec<String> = (0..7).map(|i| format!("cm-{i}")).collect();
    for name in &want {
        cms.create(&PostParams::default(), &cm(name, &[], &[]))
            .await?;
    }
    let mut got = Vec::new();
    let mut token: Option<String> = None;
    let mut pages = 0;
    let mut first_rv = None;
    loop {
        let mut lp = ListParams::default().limit(3);
        lp.continue_token = token.clone();
        let page = cms.list(&lp).await?;
        pages += 1;
        assert!(page.items.len() <= 3);
        first_rv.get_or_insert(page.metadata.resource_version.clone());
        assert_eq!(
            Some(page.metadata.resource_version.clone()),
            first_rv,
            "pages share the first page's resourceVersion"
        );
        for c in &page.items {
            if c.metadata.name.as_deref() == Some("cm-6") {
                assert!(
                    c.data.as_ref().is_none_or(|d| !d.contains_key("late")),
                    "cm-6 as it was at the first page"
                );
            }
        }
        got.extend(page.items.into_iter().filter_map(|c| c.metadata.name));
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            break;
        }
        if pages == 1 {
            // Writes between pages to objects not listed yet: the later
            // pages still show the list as of the first page's version.
            cms.delete("cm-5", &DeleteParams::default()).await?;
            cms.patch(
                "cm-6",
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"late": "yes"}})),
            )
            .await?;
            cms.create(&PostParams::default(), &cm("cm-9", &[], &[]))
                .await?;
        }
    }
    assert_eq!(pages, 3);
    got.sort();
    want.sort();
    assert_eq!(got, want, "cm-5 still listed, cm-9 not yet");
    let mut after = ListParams::default().limit(3);
    after.continue_token = None;
    let now: Vec<String> = cms
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    assert!(now.contains(&"cm-9".to_owned()) && !now.contains(&"cm-5".to_owned()));
    let mut garbage = ListParams::default().limit(3);
    garbage.continue_token = Some("not-a-token".into());
    assert_eq!(api_status(cms.list(&garbage).await).code, 400);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binding_twice_is_409() -> Result<()> {
    let Some(server) = stand_in(&[]) else {
        return Ok(());
    };
    let pods: Api<Pod> = Api::default_namespaced(client(&server).await);
    pods.create(&PostParams::default(), &pod("p", &[])).await?;
    let created = pods.get("p").await?;
    assert_eq!(
        created.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Pending")
    );
    assert_eq!(
        created.status.as_ref().and_then(|s| s.qos_class.as_deref()),
        Some("BestEffort")
    );

    let ok = bind(&pods, "p", "n1").await?;
    assert_eq!(ok["status"], "Success");
    let bound = pods.get("p").await?;
    assert_eq!(
        bound.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some("n1")
    );
    let scheduled = bound
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "PodScheduled")
        .context("PodScheduled condition")?;
    assert_eq!(scheduled.status, "True");

    let again = api_status(bind(&pods, "p", "n2").await);
    assert_eq!((again.code, again.reason.as_str()), (409, "Conflict"));
    assert!(
        again
            .message
            .contains("pod p is already assigned to node \"n1\""),
        "{}",
        again.message
    );
    assert_eq!(
        pods.get("p")
            .await?
            .spec
            .and_then(|s| s.node_name)
            .as_deref(),
        Some("n1"),
        "still on n1"
    );
    assert_eq!(api_status(bind(&pods, "ghost", "n1").await).code, 404);
    // nodeName cannot be changed by an update either.
    let moved = api_status(
        pods.patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"nodeName": "n2"}})),
        )
        .await,
    );
    assert_eq!(moved.code, 422);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_pod_delete_waits_for_the_kubelet() -> Result<()> {
    let Some(server) = stand_in(&[]) else {
        return Ok(());
    };
    let pods: Api<Pod> = Api::default_namespaced(client(&server).await);
    pods.create(&PostParams::default(), &pod("p", &[])).await?;
    bind(&pods, "p", "n1").await?;
    let start_rv = pods
        .get("p")
        .await?
        .metadata
        .resource_version
        .context("rv")?;
    let mut events = pods
        .watch(
            &WatchParams::default()
                .fields("metadata.name=p")
                .disable_bookmarks(),
            &start_rv,
        )
        .await?
        .boxed();

    let pending = pods
        .delete("p", &DeleteParams::default())
        .await?
        .left()
        .context("the pod is returned")?;
    assert!(pending.metadata.deletion_timestamp.is_some());
    assert_eq!(
        pending.metadata.deletion_grace_period_seconds,
        Some(30),
        "the pod's default grace period"
    );
    assert!(
        pods.get("p").await.is_ok(),
        "a bound pod stays until the kubelet confirms"
    );
    // What the kubelet sends once the containers stopped.
    pods.delete(
        "p",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    )
    .await?;
    assert_eq!(api_status(pods.get("p").await).code, 404);

    let mut seen = Vec::new();
    while seen.len() < 2 {
        let event = tokio::time::timeout(Duration::from_secs(10), events.try_next())
            .await??
            .context("watch ended")?;
        seen.push(match event {
            WatchEvent::Modified(p) => ("MODIFIED", p.metadata.deletion_timestamp.is_some()),
            WatchEvent::Deleted(_) => ("DELETED", true),
            other => bail!("unexpected {other:?}"),
        });
    }
    assert_eq!(seen, [("MODIFIED", true), ("DELETED", true)]);

    // An unscheduled pod goes at once; a grace period from the query is honoured.
    pods.create(&PostParams::default(), &pod("q", &[])).await?;
    pods.delete("q", &DeleteParams::default()).await?;
    assert_eq!(api_status(pods.get("q").await).code, 404);
    pods.create(&PostParams::default(), &pod("r", &[])).await?;
    bind(&pods, "r", "n1").await?;
    let r = pods
        .delete(
            "r",
            &DeleteParams {
                grace_period_seconds: Some(7),
                ..DeleteParams::default()
            },
        )
        .await?
        .left()
        .context("pod")?;
    assert_eq!(r.metadata.deletion_grace_period_seconds, Some(7));

    // A deletion that waits answers 202 Accepted with the object; the one
    // that removes it 200.
    let url = server.url()?;
    pods.create(&PostParams::default(), &pod("s", &[])).await?;
    bind(&pods, "s", "n1").await?;
    let path = "/api/v1/namespaces/default/pods/s";
    let (code, body) = raw_http(&url, &request("DELETE", path, "application/json", ""))?;
    assert_eq!(code, 202, "{body}");
    assert_eq!(
        status_of(&body)["metadata"]["deletionGracePeriodSeconds"],
        30
    );
    let (code, body) = raw_http(
        &url,
        &request(
            "DELETE",
            path,
            "application/json",
            r#"{"gracePeriodSeconds":0}"#,
        ),
    )?;
    assert_eq!(code, 200, "{body}");
    assert_eq!(status_of(&body)["metadata"]["name"], "s");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_deletion_waits_for_its_contents() -> Result<()> {
    let Some(server) = stand_in(&[]) else {
        return Ok(());
    };
    let client = client(&server).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "team"}}))?;
    namespaces.create(&PostParams::default(), &ns).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "team");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "team");
    pods.create(&PostParams::default(), &pod("running", &[]))
        .await?;
    bind(&pods, "running", "n1").await?;
    pods.create(&PostParams::default(), &pod("pending", &[]))
        .await?;
    let mut held = cm("held", &[], &[]);
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    cms.create(&PostParams::default(), &held).await?;

    let terminating = namespaces
        .delete("team", &DeleteParams::default())
        .await?
        .left()
        .context("the namespace is returned while it terminates")?;
    assert!(terminating.metadata.deletion_timestamp.is_some());
    assert_eq!(
        terminating.status.and_then(|s| s.phase).as_deref(),
        Some("Terminating")
    );
    assert_eq!(
        api_status(pods.get("pending").await).code,
        404,
        "an unbound pod goes at once"
    );
    let running = pods.get("running").await?;
    assert_eq!(
        running.metadata.deletion_grace_period_seconds,
        Some(30),
        "a bound pod is deleted gracefully, for its kubelet to confirm"
    );
    assert!(cms.get("held").await?.metadata.deletion_timestamp.is_some());
    let refused = api_status(
        cms.create(&PostParams::default(), &cm("late", &[], &[]))
            .await,
    );
    assert_eq!(
        (
            refused.code,
            refused.reason.as_str(),
            refused.message.as_str()
        ),
        (
            403,
            "Forbidden",
            "configmaps \"late\" is forbidden: unable to create new content in namespace team because it is being terminated"
        )
    );

    // The kubelet confirms, the finalizer's owner lets go: the namespace goes.
    pods.delete(
        "running",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    )
    .await?;
    assert!(
        namespaces.get("team").await.is_ok(),
        "held by the config map"
    );
    cms.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await?;
    assert_eq!(api_status(namespaces.get("team").await).code, 404);
    assert_eq!(api_status(cms.get("held").await).code, 404);

    for name in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        let e = api_status(namespaces.delete(name, &DeleteParams::default()).await);
        assert_eq!(
            (e.code, e.message),
            (
                403,
                format!("namespaces \"{name}\" is forbidden: this namespace may not be deleted")
            )
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finalizers_keep_objects_until_emptied() -> Result<()> {
    let Some(server) = stand_in(&[]) else {
        return Ok(());
    };
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&server).await);
    let mut held = cm("held", &[], &[]);
    held.metadata.finalizers = Some(vec!["example.com/keep".into()]);
    cms.create(&PostParams::default(), &held).await?;
    let deleting = cms
        .delete("held", &DeleteParams::default())
        .await?
        .left()
        .context("object returned")?;
    assert!(deleting.metadata.deletion_timestamp.is_some());
    let still = cms.get("held").await?;
    assert!(still.metadata.deletion_timestamp.is_some());
    cms.patch(
        "held",
        &PatchParams::default(),
        &Patch::Json::<()>(serde_json::from_value(
            json!([{"op": "remove", "path": "/metadata/finalizers"}]),
        )?),
    )
    .await?;
    assert_eq!(
        api_status(cms.get("held").await).code,
        404,
        "gone once its finalizers are"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_subresource_semantics() -> Result<()> {
    let Some(server) = stand_in(&[]) else {
        return Ok(());
    };
    let client = client(&server).await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    pods.create(&PostParams::default(), &pod("p", &[("a", "1")]))
        .await?;

    // The main resource ignores status.
    let mut p = pods.get("p").await?;
    p.status.get_or_insert_with(Default::default).phase = Some("Running".into());
    p.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("b".into(), "2".into());
    let updated = pods.replace("p", &PostParams::default(), &p).await?;
    assert_eq!(
        updated.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Pending")
    );
    assert_eq!(
        updated.metadata.labels.as_ref().context("labels")?["b"],
        "2"
    );
    // A PUT of a freshly built manifest (what `kubectl replace -f` sends:
    // none of the server's defaults) that changes only labels is accepted.
    let fresh = pod("p", &[("a", "1"), ("b", "2"), ("fresh", "yes")]);
    let replaced = pods.replace("p", &PostParams::default(), &fresh).await?;
    assert_eq!(
        replaced.metadata.labels.as_ref().context("labels")?["fresh"],
        "yes"
    );
    assert_eq!(
        replaced
            .spec
            .as_ref()
            .and_then(|s| s.scheduler_name.as_deref()),
        Some("default-scheduler"),
        "the defaults stay"
    );

    // /status changes only status.
    let patch = json!({"metadata": {"labels": {"c": "3"}}, "status": {"phase": "Running", "podIP": "10.0.0.5"}});
    let after = pods
        .patch_status("p", &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    assert_eq!(
        after.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Running")
    );
    assert!(
        !after
            .metadata
            .labels
            .as_ref()
            .context("labels")?
            .contains_key("c")
    );
    let mut replaced = pods.get("p").await?;
    replaced.status.get_or_insert_with(Default::default).phase = Some("Succeeded".into());
    replaced
        .spec
        .get_or_insert_with(Default::default)
        .active_deadline_seconds = Some(5);
    let after = pods
        .replace_status("p", &PostParams::default(), &replaced)
        .await?;
    assert_eq!(
        after.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded")
    );
    assert_eq!(
        after.spec.and_then(|s| s.active_deadline_seconds),
        None,
        "spec untouched by /status"
    );

    // Nodes: capacity through /status (what a kubelet does), conditions merged by type.
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "n1"}}))?,
        )
        .await?;
    let status = json!({"status": {"capacity": {"example.com/dev": "2"}, "allocatable": {"example.com/dev": "2"},
                                   "conditions": [{"type": "Ready", "status": "True"}, {"type": "MemoryPressure", "status": "False"}]}});
    nodes
        .patch_status("n1", &PatchParams::default(), &Patch::Strategic(status))
        .await?;
    let ready_false = json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}});
    let n = nodes
        .patch_status(
            "n1",
            &PatchParams::default(),
            &Patch::Strategic(ready_false),
        )
        .await?;
    let status = n.status.context("status")?;
    assert_eq!(
        status.capacity.context("capacity")?["example.com/dev"].0,
        "2"
    );
    let conditions: Vec<(String, String)> = status
        .conditions
        .unwrap_or_default()
        .into_iter()
        .map(|c| (c.type_, c.status))
        .collect();
    assert_eq!(
        conditions,
        [
            ("Ready".to_owned(), "False".to_owned()),
            ("MemoryPressure".to_owned(), "False".to_owned())
        ]
    );
    let unschedulable = nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}, "status": {"capacity": {}}})),
        )
        .await?;
    assert_eq!(unschedulable.spec.and_then(|s| s.unschedulable), Some(true));
    assert!(
        unschedulable
            .status
            .and_then(|s| s.capacity)
            .is_some_and(|c| !c.is_empty()),
        "the main resource ignores status"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_patch_types() -> Result<()> {
    let Some(server) = stand_in(&[]) else {
        return Ok(());
    };
    let client = client(&server).await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    pods.create(&PostParams::default(), &pod("p", &[("a", "1"), ("b", "2")]))
        .await?;

    // Strategic: containers and env merge by name, null deletes a label.
    let smp = json!({"metadata": {"labels": {"a": null, "c": "3"}},
                     "spec": {"containers": [{"name": "main", "image": "busybox:1.37", "env": [{"name": "A", "value": "1"}]}]}});
    let p = pods
        .patch("p", &PatchParams::default(), &Patch::Strategic(smp))
        .await?;
    let spec = p.spec.context("spec")?;
    assert_eq!(spec.containers.len(), 2, "the other container is kept");
    assert_eq!(spec.containers[0].image.as_deref(), Some("busybox:1.37"));
    assert_eq!(spec.containers[1].image.as_deref(), Some("busybox:1.36"));
    assert_eq!(spec.containers[0].env.as_ref().map(Vec::len), Some(1));
    let labels = p.metadata.labels.context("labels")?;
    assert_eq!(
        labels,
        BTreeMap::from([
            ("b".to_owned(), "2".to_owned()),
            ("c".to_owned(), "3".to_owned())
        ])
    );

    // Merge patch replaces lists; JSON patch edits by path.
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    cms.create(
        &PostParams::default(),
        &cm("c", &[], &[("x", "1"), ("y", "2")]),
    )
    .await?;
    let merged = cms
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"x": null, "z": "3"}})),
        )
        .await?;
    assert_eq!(
        merged.data.context("data")?,
        BTreeMap::from([
            ("y".to_owned(), "2".to_owned()),
            ("z".to_owned(), "3".to_owned())
        ])
    );
    let ops = json!([{"op": "test", "path": "/data/y", "value": "2"}, {"op": "replace", "path": "/data/y", "value": "20"},
                     {"op": "add", "path": "/metadata/labels", "value": {"l": "v"}}]);
    let jp = cms
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Json::<()>(serde_json::from_value(ops)?),
        )
        .await?;
    assert_eq!(jp.data.context("data")?["y"], "20");
    assert_eq!(jp.metadata.labels.context("labels")?["l"], "v");
    let failed_test = json!([{"op": "test", "path": "/data/y", "value": "nope"}]);
    let e = api_status(
        cms.patch(
            "c",
            &PatchParams::default(),
            &Patch::Json::<()>(serde_json::from_value(failed_test)?),
        )
        .await,
    );
    assert_eq!(
        (e.code, e.reason.as_str()),
        (422, "Invalid"),
        "a failed test op is refused: {e:?}"
    );
    // A JSON patch that doubles the object with each copy stops at the
    // limit (413) rather than eating the server's memory, as does one with
    // more than 10 000 operations.
    let mut bomb = Vec::new();
    // (each copy of the root to a new key doubles it)
    bomb.extend((0..40).map(|i| json!({"op": "copy", "from": "", "path": format!("/data/x{i}")})));
    let e = api_status(
        cms.patch(
            "c",
            &PatchParams::default(),
            &Patch::Json::<()>(serde_json::from_value(json!(bomb))?),
        )
        .await,
    );
    assert_eq!((e.code, e.reason.as_str()), (413, "RequestEntityTooLarge"));
    let many: Vec<Value> = (0..10_001)
        .map(|_| json!({"op": "test", "path": "/data/y", "value": "20"}))
        .collect();
    let e = api_status(
        cms.patch(
            "c",
            &PatchParams::default(),
            &Patch::Json::<()>(serde_json::from_value(json!(many))?),
        )
        .await,
    );
    assert_eq!(
        (e.code, e.message.as_str()),
        (
            413,
            "The allowed maximum operations in a JSON patch is 10000, got 10001"
        )
    );
    // A patch that makes the object the wrong type is refused, the object kept.
    let wrong = api_status(
        cms.patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"y": 5}})),
        )
        .await,
    );
    assert_eq!(wrong.code, 400);
    assert_eq!(cms.get("c").await?.data.context("data")?["y"], "20");
    Ok(())
}

/// A fixed backoff, long enough for a test to act while a watcher waits.
struct FixedBackoff(Duration);

impl Iterator for FixedBackoff {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        Some(self.0)
    }
}

impl kube::runtime::utils::Backoff for FixedBackoff {
    fn reset(&mut self) {}
}

/// Starts a reflector over the ConfigMaps of `default`; returns its reader.
fn reflect_configmaps(client: kube::Client, backoff: Duration) -> reflector::Store<ConfigMap> {
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    let (reader, writer) = reflector::store();
    let stream =
        reflector(writer, watcher(api, watcher::Config::default())).backoff(FixedBackoff(backoff));
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            if let Err(e) = item {
                eprintln!("watcher: {e}");
            }
        }
    });
    reader
}

fn names_in(reader: &reflector::Store<ConfigMap>) -> Vec<String> {
    let mut n: Vec<String> = reader
        .state()
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    n.sort();
    n
}

/// ConfigMaps a, b and c in `default`, and a reflector (200 ms backoff)
/// that has listed them.
async fn reflected_a_b_c(
    server: &StandInApiServer,
) -> Result<(Api<ConfigMap>, reflector::Store<ConfigMap>)> {
    let client = client(server).await;
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    for name in ["a", "b", "c"] {
        cms.create(&PostParams::default(), &cm(name, &[], &[]))
            .await?;
    }
    let reader = reflect_configmaps(client, Duration::from_millis(200));
    eventually(
        "the reflector to list a, b, c",
        Duration::from_secs(20),
        || names_in(&reader) == ["a", "b", "c"],
    )
    .await?;
    Ok((cms, reader))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflector_stays_in_sync_across_a_restart() -> Result<()> {
    let Some((_dir, listen, mut server)) = restartable_stand_in(&[])? else {
        return Ok(());
    };
    let (cms, reader) = reflected_a_b_c(&server).await?;
    let rv_before: u64 = cms
        .get("c")
        .await?
        .metadata
        .resource_version
        .context("rv")?
        .parse()?;

    server.restart()?;
    assert_eq!(
        server.url()?,
        format!("http://{listen}"),
        "same URL after restart"
    );
    let kept = cms.get("b").await?;
    assert_eq!(
        kept.metadata.name.as_deref(),
        Some("b"),
        "objects survive the restart"
    );
    cms.delete("a", &DeleteParams::default()).await?;
    let d = cms
        .create(&PostParams::default(), &cm("d", &[], &[]))
        .await?;
    let rv_after: u64 = d.metadata.resource_version.context("rv")?.parse()?;
    assert!(
        rv_after > rv_before,
        "the resourceVersion counter continues: {rv_after} after {rv_before}"
    );
    eventually(
        "the reflector to follow the restarted server",
        Duration::from_secs(30),
        || names_in(&reader) == ["b", "c", "d"],
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_too_old_gets_410_and_the_reflector_relists() -> Result<()> {
    let Some((_dir, _listen, mut server)) = restartable_stand_in(&["--watch-window", "5"])? else {
        return Ok(());
    };
    let client = client(&server).await;
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let first = cms
        .create(&PostParams::default(), &cm("keep", &[], &[]))
        .await?;
    cms.create(&PostParams::default(), &cm("doomed", &[], &[]))
        .await?;
    for i in 0..10 {
        cms.patch(
            "keep",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"i": i.to_string()}})),
        )
        .await?;
    }
    // A watch from a version older than the window: one ERROR event, 410 Expired.
    let old_rv = first.metadata.resource_version.context("rv")?;
    let mut stream = cms.watch(&WatchParams::default(), &old_rv).await?.boxed();
    match tokio::time::timeout(Duration::from_secs(10), stream.try_next()).await?? {
        Some(WatchEvent::Error(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
            assert!(
                status
                    .message
                    .starts_with(&format!("too old resource version: {old_rv} (")),
                "{}",
                status.message
            );
        }
        other => bail!("expected a 410 ERROR event, got {other:?}"),
    }
    assert!(
        tokio::time::timeout(Duration::from_secs(10), stream.try_next())
            .await??
            .is_none(),
        "the stream ends after the error"
    );

    let too_old = |server: &StandInApiServer| {
        server
            .log_text()
            .matches("too old resource version")
            .count()
    };
    let answered_410 = too_old(&server);
    assert_eq!(
        answered_410, 1,
        "the server logs each 410 it answers a watch with"
    );

    // A reflector away over a restart resumes from a version the restarted
    // server no longer serves (it starts past every version handed out
    // before, and keeps no history): 410 whenever it reconnects, whatever
    // its backoff, and it relists. (A running watch that falls behind the
    // window: `a_watcher_that_falls_behind_the_window_gets_410`.)
    let reader = reflect_configmaps(client.clone(), Duration::from_millis(300));
    eventually(
        "the reflector's first list",
        Duration::from_secs(20),
        || names_in(&reader) == ["doomed", "keep"],
    )
    .await?;
    server.restart()?;
    cms.delete("doomed", &DeleteParams::default()).await?;
    for i in 0..8 {
        cms.create(&PostParams::default(), &cm(&format!("new-{i}"), &[], &[]))
            .await?;
    }
    let mut want: Vec<String> = (0..8).map(|i| format!("new-{i}")).collect();
    want.push("keep".into());
    want.sort();
    eventually(
        "the reflector to relist after 410",
        Duration::from_secs(30),
        || names_in(&reader) == want,
    )
    .await?;
    assert!(
        too_old(&server) > answered_410,
        "the reflector's resumed watch was answered with 410:\n{}",
        server.log_text()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_watcher_that_falls_behind_the_window_gets_410() -> Result<()> {
    let Some(server) = stand_in(&["--watch-window", "50"]) else {
        return Ok(());
    };
    let url = server.url()?;
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&server).await);
    let rv = cms
        .create(&PostParams::default(), &cm("big", &[], &[]))
        .await?
        .metadata
        .resource_version
        .context("rv")?;
    // A raw watch whose client does not read for a while.
    let mut watcher = TcpStream::connect(url.trim_start_matches("http://"))?;
    watcher.write_all(&request(
        "GET",
        &format!("/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={rv}"),
        "application/json",
        "",
    ))?;
    // Changes of 24 KiB each, many more than fit the watch's queue (256
    // events) and the socket buffers, and than the window keeps.
    const WRITES: usize = 800;
    let value = "x".repeat(24 * 1024);
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let (cms, value) = (cms.clone(), value.clone());
            tokio::spawn(async move {
                for i in (w..WRITES).step_by(4) {
                    cms.patch(
                        "big",
                        &PatchParams::default(),
                        &Patch::Merge(json!({"data": {"v": format!("{i}{value}")}})),
                    )
                    .await?;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for w in writers {
        w.await??;
    }
    // Now it reads: what was queued, then one ERROR 410, then the end.
    let text = tokio::task::spawn_blocking(move || {
        watcher.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut response = Vec::new();
        watcher.read_to_end(&mut response)?;
        anyhow::Ok(String::from_utf8_lossy(&response).into_owned())
    })
    .await??;
    let modified = text.matches("{\"type\":\"MODIFIED\"").count();
    assert!(
        modified < WRITES,
        "the watcher fell behind: {modified} of {WRITES} changes delivered"
    );
    let error = text
        .find("{\"type\":\"ERROR\"")
        .map(|at| &text[at..text.len().min(at + 400)])
        .context("an ERROR event at the end of the stream")?;
    assert!(
        error.contains("\"code\":410") && error.contains("too old resource version"),
        "{error}"
    );
    assert!(
        text.trim_end().ends_with("0"),
        "the stream ended (last chunk): {:?}",
        &text[text.len().saturating_sub(200)..]
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_loses_recent_writes_but_never_reuses_their_versions() -> Result<()> {
    let Some((_dir, listen, mut server)) = restartable_stand_in(&[])? else {
        return Ok(());
    };
    let (cms, reader) = reflected_a_b_c(&server).await?;
    // Well past the debounced save: a, b, c are on disk.
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Two writes the reflector sees, then SIGKILL before the debounced
    // save (200 ms) writes them: the server hands out versions it loses.
    let started = Instant::now();
    let lost = cms
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"v": "lost"}})),
        )
        .await?;
    cms.create(&PostParams::default(), &cm("lost", &[], &[]))
        .await?;
    while names_in(&reader) != ["a", "b", "c", "lost"]
        && started.elapsed() < Duration::from_millis(100)
    {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    server.kill();
    let killed_after = started.elapsed();
    eprintln!("killed {killed_after:?} after the first lost write");

    server.restart()?;
    assert_eq!(server.url()?, format!("http://{listen}"));
    assert_eq!(
        api_status(cms.get("lost").await).code,
        404,
        "the create was lost with the crash"
    );
    // Writes after the restart must not reuse the lost versions.
    let after = cms
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"v": "after"}})),
        )
        .await?;
    assert_ne!(
        after.metadata.resource_version,
        lost.metadata.resource_version
    );
    cms.create(&PostParams::default(), &cm("d", &[], &[]))
        .await?;
    // The reflector, which saw the lost writes, converges on what the
    // server has (its resumed watch is refused with 410 and it relists).
    eventually(
        "the reflector to converge after the crash",
        Duration::from_secs(30),
        || {
            names_in(&reader) == ["a", "b", "c", "d"]
                && reader.state().iter().any(|c| {
                    c.metadata.name.as_deref() == Some("c")
                        && c.data.as_ref().is_some_and(|d| d["v"] == "after")
                })
        },
    )
    .await?;
    // An update carrying a lost version conflicts; it never succeeds.
    let mut stale = lost.clone();
    stale
        .data
        .get_or_insert_with(Default::default)
        .insert("v".into(), "stale".into());
    let e = api_status(cms.replace("c", &PostParams::default(), &stale).await);
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert_eq!(cms.get("c").await?.data.context("data")?["v"], "after");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_follows_selectors_and_sends_bookmarks() -> Result<()> {
    let Some(server) = stand_in(&["--bookmark-interval", "0.2"]) else {
        return Ok(());
    };
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&server).await);
    cms.create(&PostParams::default(), &cm("a", &[("app", "web")], &[]))
        .await?;
    cms.create(&PostParams::default(), &cm("b", &[("app", "db")], &[]))
        .await?;
    let mut stream = cms
        .watch(&WatchParams::default().labels("app=web").timeout(5), "0")
        .await?
        .boxed();
    let relabel = |app: &str| Patch::Merge(json!({"metadata": {"labels": {"app": app}}}));
    let mut log = Vec::new();
    let mut bookmarks = 0;
    let mut acted = false;
    while let Some(event) =
        tokio::time::timeout(Duration::from_secs(10), stream.try_next()).await??
    {
        match event {
            WatchEvent::Added(c) => {
                log.push(format!("ADDED {}", c.metadata.name.unwrap_or_default()))
            }
            WatchEvent::Modified(c) => {
                log.push(format!("MODIFIED {}", c.metadata.name.unwrap_or_default()))
            }
            WatchEvent::Deleted(c) => {
                log.push(format!("DELETED {}", c.metadata.name.unwrap_or_default()))
            }
            WatchEvent::Bookmark(_) => bookmarks += 1,
            WatchEvent::Error(e) => bail!("error event {e:?}"),
        }
        if !acted && log.len() == 1 {
            acted = true;
            cms.patch("a", &PatchParams::default(), &relabel("db"))
                .await?;
            cms.patch("b", &PatchParams::default(), &relabel("web"))
                .await?;
            cms.patch(
                "b",
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"k": "v"}})),
            )
            .await?;
            cms.delete("b", &DeleteParams::default()).await?;
        }
    }
    assert_eq!(
        log,
        ["ADDED a", "DELETED a", "ADDED b", "MODIFIED b", "DELETED b"]
    );
    assert!(
        bookmarks >= 2,
        "bookmarks every 0.2 s over ~5 s: {bookmarks}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_list_watcher_gets_initial_events_then_changes() -> Result<()> {
    let Some(server) = stand_in(&[]) else {
        return Ok(());
    };
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&server).await);
    cms.create(&PostParams::default(), &cm("a", &[], &[]))
        .await?;
    cms.create(&PostParams::default(), &cm("b", &[], &[]))
        .await?;
    // sendInitialEvents=true&resourceVersionMatch=NotOlderThan: the initial
    // objects arrive as ADDED events ended by the annotated BOOKMARK.
    let config = watcher::Config::default().streaming_lists();
    let mut events = watcher(cms.clone(), config).boxed();
    let mut initial = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(10), events.try_next())
            .await??
            .context("watcher ended")?
        {
            watcher::Event::Init => {}
            watcher::Event::InitApply(c) => initial.push(c.metadata.name.unwrap_or_default()),
            watcher::Event::InitDone => break,
            other => bail!("unexpected before InitDone: {other:?}"),
        }
    }
    initial.sort();
    assert_eq!(initial, ["a", "b"]);
    cms.create(&PostParams::default(), &cm("c", &[], &[]))
        .await?;
    match tokio::time::timeout(Duration::from_secs(10), events.try_next())
        .await??
        .context("watcher ended")?
    {
        watcher::Event::Apply(c) => assert_eq!(c.metadata.name.as_deref(), Some("c")),
        other => bail!("expected the new object, got {other:?}"),
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_compare_and_swap_writers_lose_nothing() -> Result<()> {
    let Some(server) = stand_in(&[]) else {
        return Ok(());
    };
    let client = client(&server).await;
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    cms.create(&PostParams::default(), &cm("counter", &[], &[("n", "0")]))
        .await?;
    const WRITERS: usize = 8;
    const EACH: usize = 10;
    let conflicts = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..WRITERS {
        let cms = cms.clone();
        let conflicts = conflicts.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..EACH {
                loop {
                    let mut c = cms.get("counter").await?;
                    let data = c.data.get_or_insert_with(Default::default);
                    let n: usize = data.get("n").context("n")?.parse()?;
                    data.insert("n".into(), (n + 1).to_string());
                    match cms.replace("counter", &PostParams::default(), &c).await {
                        Ok(_) => break,
                        Err(kube::Error::Api(s)) if s.code == 409 => {
                            conflicts.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => return Err(anyhow::Error::from(e)),
                    }
                }
            }
            Ok::<(), anyhow::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let n = cms.get("counter").await?.data.context("data")?["n"].clone();
    assert_eq!(
        n,
        (WRITERS * EACH).to_string(),
        "every increment kept ({} conflicts retried)",
        conflicts.load(Ordering::Relaxed)
    );
    Ok(())
}

/// Sends raw bytes on a fresh connection and returns (status code, body).
/// The whole response (status line, headers, body) to one raw request.
fn raw_response(url: &str, request: &[u8]) -> Result<String> {
    let addr = url.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.write_all(request)?;
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    Ok(String::from_utf8_lossy(&response).into_owned())
}

fn raw_http(url: &str, request: &[u8]) -> Result<(u16, String)> {
    let text = raw_response(url, request)?;
    let code = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((code, body))
}

fn request(method: &str, path: &str, content_type: &str, body: &str) -> Vec<u8> {
    format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Whether a raw watch at `path` answers 200 and is still open after 1.5 s.
fn watch_stays_open(url: &str, path: &str) -> Result<bool> {
    let mut stream = TcpStream::connect(url.trim_start_matches("http://"))?;
    stream.set_read_timeout(Some(Duration::from_millis(1500)))?;
    stream.write_all(&request("GET", path, "application/json", ""))?;
    let mut response = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => response.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                let head = String::from_utf8_lossy(&response);
                return Ok(head.starts_with("HTTP/1.1 200"));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(false)
}

fn status_of(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not a Status JSON ({e}): {body:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_oversized_and_unknown_requests_get_statuses() -> Result<()> {
    let Some(server) = stand_in(&["--max-body-bytes", "2048"]) else {
        return Ok(());
    };
    let url = server.url()?;
    let client = client(&server).await;
    // A watch open through all of it must keep working.
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let mut watch = cms
        .watch(&WatchParams::default().disable_bookmarks(), "0")
        .await?
        .boxed();
    let pods = "/api/v1/namespaces/default/pods";
    let json_ct = "application/json";

    let cases: Vec<(Vec<u8>, u16, &str)> = vec![
        (request("POST", pods, json_ct, "{\"metadata\": {"), 400, "BadRequest"),
        (request("POST", pods, json_ct, "[1, 2]"), 400, "BadRequest"),
        (request("POST", pods, json_ct, r#"{"metadata": {"name": 5}}"#), 400, "BadRequest"),
        (request("POST", pods, json_ct, r#"{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}"#), 400, "BadRequest"),
        (request("POST", pods, json_ct, ""), 400, "BadRequest"),
        (request("POST", pods, json_ct, "\u{0}\u{1}\u{2}"), 400, "BadRequest"),
        (request("PATCH", &format!("{pods}/nope"), "application/merge-patch+json", "{"), 404, "NotFound"),
        (request("POST", &format!("{pods}/nope/binding"), json_ct, "{"), 400, "BadRequest"),
        (request("POST", &format!("{pods}/nope/binding"), json_ct, r#"{"metadata": {"name": "nope"}, "target": {"name": "n1"}}"#), 404, "NotFound"),
        (request("GET", "/api/v1/widgets", json_ct, ""), 404, "NotFound"),
        (request("GET", "/apis/batch/v1/namespaces/default/jobs", json_ct, ""), 404, "NotFound"),
        (request("GET", "/api/v1/namespaces/default/pods/p/exec", json_ct, ""), 404, "NotFound"),
        (request("PUT", pods, json_ct, "{}"), 405, "MethodNotAllowed"),
        (request("POST", "/api/v1/watch/namespaces/default/configmaps", json_ct, r#"{"metadata": {"name": "w"}}"#), 405, "MethodNotAllowed"),
        (request("DELETE", "/api/v1/watch/namespaces/default/configmaps", json_ct, ""), 405, "MethodNotAllowed"),
        (request("PUT", "/api/v1/watch/namespaces/default/configmaps/w", json_ct, "{}"), 405, "MethodNotAllowed"),
        (request("GET", &format!("{pods}?watch=true&resourceVersion=abc"), json_ct, ""), 400, "BadRequest"),
        (request("GET", &format!("{pods}?limit=x"), json_ct, ""), 400, "BadRequest"),
        (
            format!("POST {pods} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n").into_bytes(),
            413,
            "RequestEntityTooLarge",
        ),
    ];
    for (req, code, reason) in cases {
        let shown = String::from_utf8_lossy(&req[..req.len().min(80)]).into_owned();
        let (got, body) = raw_http(&url, &req)?;
        assert_eq!(got, code, "{shown:?} → {body}");
        let status = status_of(&body);
        assert_eq!(status["kind"], "Status", "{body}");
        assert_eq!(status["status"], "Failure");
        assert_eq!(status["reason"], reason, "{shown:?} → {body}");
        assert_eq!(status["code"], code);
    }
    assert_eq!(
        api_status(cms.get("w").await).code,
        404,
        "nothing created through /watch/"
    );
    // A watch with a timeout too large to represent, or 0 (the server's
    // default), stays open rather than ending (or panicking) at once.
    for timeout in ["18446744073709551615", "0"] {
        let path =
            format!("/api/v1/namespaces/default/configmaps?watch=1&timeoutSeconds={timeout}");
        assert!(
            watch_stays_open(&url, &path)?,
            "timeoutSeconds={timeout}: the watch ended at once"
        );
    }
    // Garbage that is not HTTP, and a connection that dies mid-body.
    let _ = raw_http(&url, b"\x16\x03\x01 not http at all\r\n\r\n")?;
    {
        let mut half = TcpStream::connect(url.trim_start_matches("http://"))?;
        half.write_all(format!("POST {pods} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{{\"meta").as_bytes())?;
    }
    // Oversized through the real client too: refused, nothing stored.
    let big = "x".repeat(4096);
    let too_big = cms
        .create(&PostParams::default(), &cm("big", &[], &[("v", &big)]))
        .await;
    assert!(too_big.is_err(), "a body over --max-body-bytes is refused");
    assert_eq!(api_status(cms.get("big").await).code, 404);

    // The server survived: a write shows up on the watch opened before.
    cms.create(&PostParams::default(), &cm("after", &[], &[]))
        .await?;
    loop {
        match tokio::time::timeout(Duration::from_secs(10), watch.try_next())
            .await??
            .context("watch ended")?
        {
            WatchEvent::Added(c) if c.metadata.name.as_deref() == Some("after") => break,
            WatchEvent::Error(e) => bail!("watch error {e:?}"),
            _ => {}
        }
    }
    let ns: Api<Namespace> = Api::all(client);
    assert!(ns.get("default").await.is_ok());
    assert!(
        !server.log_text().contains("panicked"),
        "{}",
        server.log_text()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_file_survives_restart_and_corruption_is_refused() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let state = dir.path().join("state.json");
    let state_arg = state.to_str().context("path")?.to_owned();
    let Some(mut server) = stand_in(&["--state", &state_arg]) else {
        return Ok(());
    };
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&server).await);
    cms.create(&PostParams::default(), &cm("kept", &[], &[("v", "1")]))
        .await?;
    let mut watch = cms
        .watch(&WatchParams::default().disable_bookmarks(), "0")
        .await?
        .boxed();
    server.stop();
    // SIGTERM closes open watches cleanly and exits (no SIGKILL needed).
    let mut ended = false;
    while let Ok(next) = tokio::time::timeout(Duration::from_secs(5), watch.next()).await {
        if next.is_none() {
            ended = true;
            break;
        }
    }
    assert!(ended, "the watch stream ended at shutdown");
    assert!(
        server.log_text().contains("stopped"),
        "clean shutdown:\n{}",
        server.log_text()
    );
    let saved: Value = serde_json::from_slice(&std::fs::read(&state)?)?;
    assert!(
        saved["objects"]
            .as_array()
            .is_some_and(|o| o.iter().any(|x| x["metadata"]["name"] == "kept"))
    );

    server.restart()?;
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&server).await);
    assert_eq!(cms.get("kept").await?.data.context("data")?["v"], "1");
    server.stop();

    std::fs::write(&state, b"{\"resourceVersion\": 12, \"objects\": ")?;
    let refused = StandInApiServer::start(&["--state", &state_arg]);
    let Err(e) = refused else {
        bail!("a corrupt state file was accepted")
    };
    let text = format!("{e:#}");
    let line = text
        .lines()
        .find(|l| l.contains("state file"))
        .context("names the state file")?;
    assert!(line.contains(&state_arg), "{line}");
    assert_eq!(
        std::fs::read(&state)?,
        b"{\"resourceVersion\": 12, \"objects\": ",
        "the file is left untouched"
    );
    Ok(())
}

/// The values of every `Warning` header of a raw response.
fn warning_headers(response: &str) -> Vec<String> {
    let head = response.split("\r\n\r\n").next().unwrap_or("");
    head.lines()
        .filter_map(|l| l.split_once(':'))
        .filter(|(name, _)| name.eq_ignore_ascii_case("warning"))
        .map(|(_, value)| value.trim().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn field_validation_strict_warn_and_ignore() -> Result<()> {
    let Some(server) = stand_in(&[]) else {
        return Ok(());
    };
    let url = server.url()?;
    let pods: Api<Pod> = Api::namespaced(client(&server).await, "default");
    // A pod with two misspelt fields (one inside a list) and a null the
    // decoder may drop without complaint.
    let body = |name: &str| {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "creationTimestamp": null},
            "spec": {"containers": [{"name": "c", "image": "busybox:1.36", "imagePullPolicyy": "Always"}],
                     "nodeSelectr": {"a": "b"}}
        })
        .to_string()
    };
    let post = |query: &str, name: &str| {
        request(
            "POST",
            &format!("/api/v1/namespaces/default/pods{query}"),
            "application/json",
            &body(name),
        )
    };

    // Strict: 400 BadRequest naming both fields; nothing created.
    let (code, text) = raw_http(&url, &post("?fieldValidation=Strict", "strict"))?;
    assert_eq!(code, 400, "{text}");
    let status = status_of(&text);
    assert_eq!(status["reason"], "BadRequest");
    let message = status["message"].as_str().unwrap_or("");
    let detail = message
        .split_once("strict decoding error: ")
        .map(|(_, d)| d)
        .with_context(|| format!("no strict decoding error in {message:?}"))?;
    let mut fields: Vec<&str> = detail.split(", ").collect();
    fields.sort_unstable();
    assert_eq!(
        fields,
        [
            r#"unknown field "spec.containers[0].imagePullPolicyy""#,
            r#"unknown field "spec.nodeSelectr""#
        ]
    );
    assert_eq!(api_status(pods.get("strict").await).code, 404);

    // Warn (also the default): created, one Warning header per field.
    for (query, name) in [("?fieldValidation=Warn", "warned"), ("", "default")] {
        let response = raw_response(&url, &post(query, name))?;
        assert!(response.starts_with("HTTP/1.1 201"), "{response}");
        let mut warnings = warning_headers(&response);
        warnings.sort_unstable();
        assert_eq!(
            warnings,
            [
                r#"299 - "unknown field \"spec.containers[0].imagePullPolicyy\"""#,
                r#"299 - "unknown field \"spec.nodeSelectr\"""#
            ],
            "{query:?}"
        );
        let stored = pods.get(name).await?;
        assert!(stored.spec.expect("spec").node_selector.is_none());
    }

    // Ignore: created without a word.
    let response = raw_response(&url, &post("?fieldValidation=Ignore", "ignored"))?;
    assert!(response.starts_with("HTTP/1.1 201"), "{response}");
    assert!(warning_headers(&response).is_empty(), "{response}");

    // Update (PUT) and patch follow the same rules.
    let mut current: Value = serde_json::to_value(pods.get("ignored").await?)?;
    current["spec"]["activeDeadlineSecond"] = json!(5);
    let (code, text) = raw_http(
        &url,
        &request(
            "PUT",
            "/api/v1/namespaces/default/pods/ignored?fieldValidation=Strict",
            "application/json",
            &current.to_string(),
        ),
    )?;
    assert_eq!(code, 400, "{text}");
    assert!(
        status_of(&text)["message"]
            .as_str()
            .unwrap_or("")
            .ends_with(r#"strict decoding error: unknown field "spec.activeDeadlineSecond""#),
        "{text}"
    );
    let strict = PatchParams {
        field_validation: Some(kube::api::ValidationDirective::Strict),
        ..PatchParams::default()
    };
    let typo = json!({"metadata": {"labels": {"ok": "yes"}}, "spec": {"tolerationz": []}});
    for patch in [
        Patch::Merge(typo.clone()),
        Patch::Strategic(typo.clone()),
        Patch::Json(serde_json::from_value(
            json!([{"op": "add", "path": "/spec/tolerationz", "value": []}]),
        )?),
    ] {
        let status = api_status(pods.patch("ignored", &strict, &patch).await);
        assert_eq!((status.code, status.reason.as_str()), (400, "BadRequest"));
        assert!(
            status
                .message
                .contains(r#"strict decoding error: unknown field "spec.tolerationz""#),
            "{}",
            status.message
        );
    }
    assert!(
        pods.get("ignored").await?.metadata.labels.is_none(),
        "a refused patch changes nothing"
    );
    let warn = PatchParams {
        field_validation: Some(kube::api::ValidationDirective::Warn),
        ..PatchParams::default()
    };
    let patched = pods.patch("ignored", &warn, &Patch::Merge(typo)).await?;
    assert_eq!(
        patched
            .metadata
            .labels
            .unwrap_or_default()
            .get("ok")
            .map(String::as_str),
        Some("yes")
    );
    // A patch of known fields only passes Strict.
    pods.patch(
        "ignored",
        &strict,
        &Patch::Strategic(json!({"spec": {"activeDeadlineSeconds": 60}})),
    )
    .await?;

    let (code, text) = raw_http(&url, &post("?fieldValidation=Loose", "loose"))?;
    assert_eq!(code, 400, "{text}");
    assert!(text.contains("fieldValidation"), "{text}");
    pods.get("warned").await?;
    Ok(())
}
