//! The stand-in kube-scheduler (`tessera-sim scheduler`) end to end: the
//! real binary against a fresh stand-in API server per test and an in-test
//! fake extender speaking the extender HTTP+JSON wire format. The expected
//! wire keys and messages are written here from kube-scheduler's documented
//! behaviour, not taken from the scheduler's code.
//!
//! These tests always start their own stand-in, even when
//! `TESSERA_E2E_KUBECONFIG` names a real cluster: each needs a cluster to
//! itself (a scheduler sees every node, and the tests check what it sends
//! about all of them and messages counting them: `0/3 nodes are
//! available`), and creating Ready nodes with no kubelet behind them would
//! draw a real cluster's own pods onto them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tessera_test_support::kube::{self as tkube, Cluster};
use tessera_test_support::{Need, require};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// The profile every test schedules with (so a real cluster's own
/// scheduler leaves the test pods alone).
const SCHED: &str = "tessera-test-scheduler";
const DEV: &str = "example.com/dev";
const NS: &str = "default";
const WAIT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------
// A fake extender: a tiny HTTP/1.1 server recording every request.

#[derive(Clone, Debug)]
struct Recorded {
    method: String,
    path: String,
    content_type: String,
    body: Value,
}

type Reply = (u16, Value);
type Handler = Arc<dyn Fn(String, Value) -> BoxFuture<'static, Reply> + Send + Sync>;

struct FakeExtender {
    url: String,
    log: Arc<Mutex<Vec<Recorded>>>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeExtender {
    async fn start(handler: Handler) -> Result<FakeExtender> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/ext", listener.local_addr()?);
        let log: Arc<Mutex<Vec<Recorded>>> = Arc::default();
        let task_log = log.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (handler, log) = (handler.clone(), task_log.clone());
                tokio::spawn(async move {
                    if let Err(e) = serve_one(stream, handler, log).await {
                        eprintln!("fake extender: {e:#}");
                    }
                });
            }
        });
        Ok(FakeExtender { url, log, task })
    }

    /// Requests so far to `<url>/<verb>`.
    fn requests(&self, verb: &str) -> Vec<Recorded> {
        let want = format!("/ext/{verb}");
        self.log
            .lock()
            .expect("log")
            .iter()
            .filter(|r| r.path == want)
            .cloned()
            .collect()
    }
}

impl Drop for FakeExtender {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

async fn serve_one(
    mut stream: tokio::net::TcpStream,
    handler: Handler,
    log: Arc<Mutex<Vec<Recorded>>>,
) -> Result<()> {
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(pos) = find(&buf, b"\r\n\r\n") {
            break pos;
        }
        if stream.read_buf(&mut buf).await? == 0 {
            return Ok(());
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let mut lines = head.lines();
    let mut first = lines.next().context("no request line")?.split_whitespace();
    let method = first.next().unwrap_or_default().to_owned();
    let path = first.next().unwrap_or_default().to_owned();
    let mut length = 0usize;
    let mut content_type = String::new();
    for line in lines {
        if let Some((k, v)) = line.split_once(':') {
            match k.trim().to_ascii_lowercase().as_str() {
                "content-length" => length = v.trim().parse()?,
                "content-type" => content_type = v.trim().to_owned(),
                _ => {}
            }
        }
    }
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < length {
        if stream.read_buf(&mut body).await? == 0 {
            bail!("body cut short");
        }
    }
    let body: Value = serde_json::from_slice(&body).context("request body is not JSON")?;
    log.lock().expect("log").push(Recorded {
        method,
        path: path.clone(),
        content_type,
        body: body.clone(),
    });
    let verb = path.rsplit('/').next().unwrap_or_default().to_owned();
    let (status, reply) = handler(verb, body).await;
    let text = reply.to_string();
    let response = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await.ok();
    Ok(())
}

fn handler<F>(f: F) -> Handler
where
    F: Fn(String, Value) -> BoxFuture<'static, Reply> + Send + Sync + 'static,
{
    Arc::new(f)
}

/// An extender that binds through the API, as a real one does, after
/// recording the request; other verbs get `other`.
fn binding_handler(
    client: kube::Client,
    other: impl Fn(&str, &Value) -> Reply + Send + Sync + 'static,
) -> Handler {
    let other = Arc::new(other);
    handler(move |verb, body| {
        let client = client.clone();
        let other = other.clone();
        Box::pin(async move {
            if verb != "bind" {
                return other(&verb, &body);
            }
            let ns = body["PodNamespace"].as_str().unwrap_or_default().to_owned();
            let binding = json!({
                "apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": body["PodName"], "namespace": ns, "uid": body["PodUID"]},
                "target": {"apiVersion": "v1", "kind": "Node", "name": body["Node"]},
            });
            let api: Api<Pod> = Api::namespaced(client, &ns);
            let name = body["PodName"].as_str().unwrap_or_default();
            match api
                .create_subresource::<Value, Value>(
                    "binding",
                    name,
                    &PostParams::default(),
                    &binding,
                )
                .await
            {
                Ok(_) => (200, json!({"Error": ""})),
                Err(e) => (200, json!({"Error": e.to_string()})),
            }
        })
    })
}

/// Names sent in a filter/prioritize request (NodeNames or Nodes.items).
fn names_sent(body: &Value) -> Vec<String> {
    if let Some(names) = body["NodeNames"].as_array() {
        return names
            .iter()
            .filter_map(|n| n.as_str().map(String::from))
            .collect();
    }
    body["Nodes"]["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n["metadata"]["name"].as_str().map(String::from))
        .collect()
}

// ---------------------------------------------------------------------------
// The scheduler process.

struct SchedulerProcess {
    child: Option<Child>,
    log: PathBuf,
}

impl SchedulerProcess {
    fn start(dir: &Path, kubeconfig: &Path, config: &str) -> Result<SchedulerProcess> {
        let config_path = dir.join("scheduler-config.yaml");
        std::fs::write(&config_path, config)?;
        let log = dir.join("scheduler.log");
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)?;
        let child = Command::new(tessera_test_support::artefact("tessera-sim"))
            .arg("scheduler")
            .arg("--config")
            .arg(&config_path)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .env("TESSERA_LOG", "info,tessera_kube_scheduler=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .context("spawning tessera-sim scheduler")?;
        Ok(SchedulerProcess {
            child: Some(child),
            log,
        })
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether the process still runs (has not exited or crashed).
    fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    fn signal(&mut self, signal: rustix::process::Signal) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        let pid = rustix::process::Pid::from_child(&child);
        let _ = rustix::process::kill_process(pid, signal);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                return child.wait().ok();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM; the exit status.
    fn stop(&mut self) -> Option<std::process::ExitStatus> {
        self.signal(rustix::process::Signal::TERM)
    }

    /// A crash: SIGKILL.
    fn kill(&mut self) {
        self.signal(rustix::process::Signal::KILL);
    }
}

impl Drop for SchedulerProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

fn scheduler_config(extenders: Value) -> String {
    json!({
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "profiles": [{"schedulerName": SCHED}],
        "extenders": extenders,
    })
    .to_string()
}

// ---------------------------------------------------------------------------
// The cluster side.

struct Env {
    cluster: Cluster,
    client: kube::Client,
    dir: tempfile::TempDir,
}

impl Env {
    /// A fresh stand-in API server of its own (see the module doc).
    async fn new() -> Result<Env> {
        let cluster = Cluster::StandIn(tkube::StandInApiServer::start(&[])?);
        let client = tkube::client(cluster.kubeconfig()).await?;
        let dir = tempfile::Builder::new()
            .prefix("tessera-scheduler-")
            .tempdir()?;
        Ok(Env {
            cluster,
            client,
            dir,
        })
    }

    fn scheduler(&self, config: &str) -> Result<SchedulerProcess> {
        SchedulerProcess::start(self.dir.path(), self.cluster.kubeconfig(), config)
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), NS)
    }

    async fn add_node(&self, name: &str, devices: u32, labels: Value) -> Result<()> {
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels},
            "spec": {},
        }))?;
        self.nodes().create(&PostParams::default(), &node).await?;
        self.set_devices(name, devices).await
    }

    /// Sets the node's status: Ready, 8 cpu, 32 GiB, 110 pods and
    /// `devices` × example.com/dev.
    async fn set_devices(&self, name: &str, devices: u32) -> Result<()> {
        let resources =
            json!({"cpu": "8", "memory": "32Gi", "pods": "110", DEV: devices.to_string()});
        let status = json!({"status": {
            "capacity": resources, "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test node"}],
        }});
        self.nodes()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await?;
        Ok(())
    }

    /// A pod of our profile with a `devices` × example.com/dev limit (no
    /// resources at all for 0).
    async fn add_pod(&self, name: &str, devices: u32) -> Result<Pod> {
        let mut pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "schedulerName": SCHED,
                "containers": [{
                    "name": "main", "image": "busybox",
                    "resources": {"limits": {DEV: devices.to_string()}},
                }],
            },
        }))?;
        if devices == 0
            && let Some(spec) = pod.spec.as_mut()
        {
            spec.containers[0].resources = None;
        }
        Ok(self.pods().create(&PostParams::default(), &pod).await?)
    }

    async fn node_of(&self, pod: &str) -> Result<Option<String>> {
        let p = self.pods().get(pod).await?;
        Ok(p.spec.and_then(|s| s.node_name).filter(|n| !n.is_empty()))
    }

    async fn wait_bound(&self, pod: &str, sched: &SchedulerProcess) -> Result<String> {
        match poll(|| self.node_of(pod)).await? {
            Some(node) => Ok(node),
            None => bail!(
                "pod {pod} not bound in {WAIT:?}; scheduler log:\n{}",
                sched.log_text()
            ),
        }
    }

    async fn events_of(&self, pod: &str, reason: &str) -> Result<Vec<Event>> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), NS);
        Ok(events
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .filter(|e| {
                e.involved_object.name.as_deref() == Some(pod)
                    && e.reason.as_deref() == Some(reason)
            })
            .collect())
    }

    /// Waits for a FailedScheduling event about `pod` whose message passes
    /// `accept`.
    async fn wait_failed(
        &self,
        pod: &str,
        sched: &SchedulerProcess,
        accept: impl Fn(&Event) -> bool,
    ) -> Result<Event> {
        let accept = &accept;
        let found = poll(|| async move {
            let events = self.events_of(pod, "FailedScheduling").await?;
            Ok(events.into_iter().find(|e| accept(e)))
        })
        .await?;
        if let Some(event) = found {
            return Ok(event);
        }
        let events = self.events_of(pod, "FailedScheduling").await?;
        bail!(
            "no matching FailedScheduling event for {pod} in {WAIT:?}; events: {:?}\nscheduler log:\n{}",
            events.iter().map(|e| e.message.clone()).collect::<Vec<_>>(),
            sched.log_text()
        );
    }

    async fn pod_scheduled_condition(&self, pod: &str) -> Result<Option<(String, String, String)>> {
        let p = self.pods().get(pod).await?;
        Ok(p.status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "PodScheduled")
            .map(|c| {
                (
                    c.status,
                    c.reason.unwrap_or_default(),
                    c.message.unwrap_or_default(),
                )
            }))
    }
}

/// Calls `check` every 100 ms until it gives `Some`, for [`WAIT`] at most;
/// `None` when it never did.
async fn poll<T, F, Fut>(mut check: F) -> Result<Option<T>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(value) = check().await? {
            return Ok(Some(value));
        }
        if Instant::now() > deadline {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

macro_rules! prerequisites {
    () => {
        let Ok(()) = require(&[Need::Built("tessera-sim")]) else {
            return Ok(());
        };
    };
}

fn pass_all(verb: &str, body: &Value) -> Reply {
    match verb {
        "filter" if body["NodeNames"].is_array() => (200, json!({"NodeNames": body["NodeNames"]})),
        "filter" => (200, json!({"Nodes": body["Nodes"]})),
        _ => (404, json!({})),
    }
}

// ---------------------------------------------------------------------------

/// nodeCacheCapable: the filter gets node names only; the extender's
/// bindVerb binds (exactly once); a Scheduled event follows.
#[tokio::test(flavor = "multi_thread")]
async fn binds_through_the_extender_bind_verb_sending_node_names() -> Result<()> {
    prerequisites!();
    let env = Env::new().await?;
    env.add_node("n1", 1, json!({})).await?;
    env.add_node("n2", 0, json!({})).await?;
    let ext = FakeExtender::start(binding_handler(env.client.clone(), pass_all)).await?;
    let sched = env.scheduler(&scheduler_config(json!([{
        "urlPrefix": ext.url, "filterVerb": "filter", "bindVerb": "bind",
        "nodeCacheCapable": true, "weight": 1,
        "managedResources": [{"name": DEV}],
    }])))?;
    let pod = env.add_pod("p1", 1).await?;
    let node = env.wait_bound("p1", &sched).await?;
    assert_eq!(node, "n1", "n2 has no example.com/dev");

    let filters = ext.requests("filter");
    assert_eq!(filters.len(), 1, "{filters:?}");
    let f = &filters[0];
    assert_eq!(f.method, "POST");
    assert!(
        f.content_type.starts_with("application/json"),
        "{}",
        f.content_type
    );
    assert_eq!(
        f.body["NodeNames"],
        json!(["n1"]),
        "only the node that fits is sent"
    );
    assert!(
        f.body.get("Nodes").is_none_or(Value::is_null),
        "no whole nodes: {}",
        f.body
    );
    assert_eq!(f.body["Pod"]["metadata"]["name"], "p1");
    assert_eq!(f.body["Pod"]["metadata"]["uid"], json!(pod.metadata.uid));

    let binds = ext.requests("bind");
    assert_eq!(binds.len(), 1);
    assert_eq!(
        binds[0].body,
        json!({"PodName": "p1", "PodNamespace": NS, "PodUID": pod.metadata.uid, "Node": "n1"})
    );
    let env = &env;
    let e = poll(|| async move { Ok(env.events_of("p1", "Scheduled").await?.into_iter().next()) })
        .await?
        .context("no Scheduled event")?;
    assert_eq!(
        e.message.as_deref(),
        Some("Successfully assigned default/p1 to n1")
    );
    assert_eq!(e.type_.as_deref(), Some("Normal"));
    assert_eq!(
        e.source.as_ref().and_then(|s| s.component.as_deref()),
        Some(SCHED)
    );
    assert_eq!(e.involved_object.uid, pod.metadata.uid);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(ext.requests("bind").len(), 1, "bound once");
    Ok(())
}

/// Without nodeCacheCapable the filter gets whole nodes and answers with
/// whole nodes; without a bindVerb the scheduler binds with a Binding.
#[tokio::test(flavor = "multi_thread")]
async fn sends_whole_nodes_and_binds_through_the_api() -> Result<()> {
    prerequisites!();
    let env = Env::new().await?;
    for n in ["n1", "n2", "n3"] {
        env.add_node(n, 2, json!({"rack": n})).await?;
    }
    // Keeps only n2.
    let ext = FakeExtender::start(handler(|_verb, body| {
        Box::pin(async move {
            let items: Vec<Value> = body["Nodes"]["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|n| n["metadata"]["name"] == "n2")
                .cloned()
                .collect();
            // A failed entry for a node not sent is no error (kube-scheduler
            // records it).
            (
                200,
                json!({"Nodes": {"items": items}, "FailedNodes": {"gone": "deleted"}, "Error": ""}),
            )
        })
    }))
    .await?;
    let sched = env.scheduler(&scheduler_config(json!([{
        "urlPrefix": format!("{}/", ext.url), "filterVerb": "filter",
    }])))?;
    env.add_pod("p1", 1).await?;
    assert_eq!(env.wait_bound("p1", &sched).await?, "n2");
    let f = &ext.requests("filter")[0];
    assert!(
        f.body.get("NodeNames").is_none_or(Value::is_null),
        "{}",
        f.body
    );
    assert_eq!(names_sent(&f.body), vec!["n1", "n2", "n3"]);
    let n1 = &f.body["Nodes"]["items"][0];
    assert_eq!(n1["metadata"]["labels"]["rack"], "n1", "whole node objects");
    assert_eq!(n1["status"]["allocatable"][DEV], "2");
    Ok(())
}

/// FailedNodes and FailedAndUnresolvableNodes reasons land, with the
/// scheduler's own reasons, in one FailedScheduling event (its count going
/// up on retries) and in the PodScheduled condition, shaped as
/// kube-scheduler shapes them.
#[tokio::test(flavor = "multi_thread")]
async fn extender_reasons_appear_in_the_event_and_the_condition() -> Result<()> {
    prerequisites!();
    let env = Env::new().await?;
    env.add_node("n1", 0, json!({})).await?;
    env.add_node("n2", 4, json!({})).await?;
    env.add_node("n3", 4, json!({})).await?;
    let ext = FakeExtender::start(handler(|_verb, _body| {
        Box::pin(async move {
            (
                200,
                json!({
                    "NodeNames": [],
                    "FailedNodes": {"n2": "gpu busy"},
                    "FailedAndUnresolvableNodes": {"n3": "wrong model"},
                }),
            )
        })
    }))
    .await?;
    let sched = env.scheduler(&scheduler_config(json!([{
        "urlPrefix": ext.url, "filterVerb": "filter", "nodeCacheCapable": true,
    }])))?;
    env.add_pod("p1", 1).await?;
    let want = "0/3 nodes are available: 1 Insufficient example.com/dev, 1 gpu busy, 1 wrong model. \
                preemption: 0/3 nodes are available: 1 Preemption is not helpful for scheduling, \
                2 No preemption victims found for incoming pod.";
    env.wait_failed("p1", &sched, |_| true).await?;
    // The scheduler's own filter rejected n1, so the pod is parked until the
    // cluster changes, not retried on a back-off (1 s, then 2 s).
    tokio::time::sleep(Duration::from_secs(4)).await;
    let events = env.events_of("p1", "FailedScheduling").await?;
    assert_eq!(
        events.iter().map(|e| e.count).collect::<Vec<_>>(),
        vec![Some(1)],
        "no retry without a cluster change; log:\n{}",
        sched.log_text()
    );
    assert_eq!(ext.requests("filter").len(), 1);
    // A node update brings it back at once.
    env.nodes()
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"labels": {"touched": "yes"}}})),
        )
        .await?;
    let event = env
        .wait_failed("p1", &sched, |e| e.count.unwrap_or(0) >= 2)
        .await?;
    assert_eq!(event.message.as_deref(), Some(want));
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(
        event.source.as_ref().and_then(|s| s.component.as_deref()),
        Some(SCHED)
    );
    assert_eq!(event.reporting_component.as_deref(), Some(SCHED));
    assert_eq!(event.involved_object.kind.as_deref(), Some("Pod"));
    assert!(event.involved_object.uid.is_some());
    assert!(event.first_timestamp.is_some() && event.last_timestamp.is_some());
    assert_eq!(
        env.events_of("p1", "FailedScheduling").await?.len(),
        1,
        "repeats raise the count of one event"
    );
    assert_eq!(
        env.pod_scheduled_condition("p1").await?,
        Some(("False".into(), "Unschedulable".into(), want.into()))
    );
    assert_eq!(
        names_sent(&ext.requests("filter")[0].body),
        vec!["n2", "n3"]
    );
    assert_eq!(env.node_of("p1").await?, None);
    Ok(())
}

async fn closed_port_url() -> Result<String> {
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/ext", l.local_addr()?);
    drop(l);
    Ok(url)
}

/// An ignorable extender that is down is skipped for filter, prioritize and
/// bind: the pod is bound through the API.
#[tokio::test(flavor = "multi_thread")]
async fn an_ignorable_extender_that_is_down_is_skipped() -> Result<()> {
    prerequisites!();
    let env = Env::new().await?;
    env.add_node("n1", 1, json!({})).await?;
    env.add_node("n2", 1, json!({})).await?;
    let url = closed_port_url().await?;
    let sched = env.scheduler(&scheduler_config(json!([{
        "urlPrefix": url, "filterVerb": "filter", "prioritizeVerb": "prioritize",
        "bindVerb": "bind", "weight": 1, "ignorable": true,
    }])))?;
    env.add_pod("p1", 1).await?;
    let node = env.wait_bound("p1", &sched).await?;
    assert!(node == "n1" || node == "n2");
    assert!(env.events_of("p1", "FailedScheduling").await?.is_empty());
    Ok(())
}

/// A non-ignorable extender that is down fails the attempt with its error
/// (reason SchedulerError); once it is up, the pod is scheduled.
#[tokio::test(flavor = "multi_thread")]
async fn an_extender_that_is_down_fails_scheduling_with_its_error() -> Result<()> {
    prerequisites!();
    let env = Env::new().await?;
    env.add_node("n1", 1, json!({})).await?;
    let url = closed_port_url().await?;
    let sched = env.scheduler(&scheduler_config(json!([{
        "urlPrefix": url, "filterVerb": "filter", "nodeCacheCapable": true,
    }])))?;
    env.add_pod("p1", 1).await?;
    let post = format!("Post \"{url}/filter\"");
    let event = env
        .wait_failed("p1", &sched, |e| {
            e.message.as_deref().is_some_and(|m| m.contains(&post))
        })
        .await?;
    let message = event.message.unwrap_or_default();
    assert!(!message.contains("nodes are available"), "{message}");
    let (status, reason, cond_message) = env
        .pod_scheduled_condition("p1")
        .await?
        .context("no condition")?;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "SchedulerError")
    );
    assert_eq!(cond_message, message);
    assert_eq!(env.node_of("p1").await?, None);

    // The extender comes up on that port: the back-off retry binds the pod.
    let addr = url
        .trim_start_matches("http://")
        .trim_end_matches("/ext")
        .to_owned();
    let listener = TcpListener::bind(&addr).await?;
    let served = Arc::new(Mutex::new(0usize));
    let count = served.clone();
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            *count.lock().expect("count") += 1;
            let h = handler(|v, b| Box::pin(async move { pass_all(&v, &b) }));
            tokio::spawn(serve_one(stream, h, Arc::default()));
        }
    });
    assert_eq!(env.wait_bound("p1", &sched).await?, "n1");
    assert!(*served.lock().expect("count") >= 1);
    task.abort();
    Ok(())
}

/// An extender slower than httpTimeout is an error naming the timeout.
#[tokio::test(flavor = "multi_thread")]
async fn a_slow_extender_times_out() -> Result<()> {
    prerequisites!();
    let env = Env::new().await?;
    env.add_node("n1", 1, json!({})).await?;
    let ext = FakeExtender::start(handler(|verb, body| {
        Box::pin(async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            pass_all(&verb, &body)
        })
    }))
    .await?;
    let sched = env.scheduler(&scheduler_config(json!([{
        "urlPrefix": ext.url, "filterVerb": "filter", "nodeCacheCapable": true, "httpTimeout": "300ms",
    }])))?;
    env.add_pod("p1", 1).await?;
    let started = Instant::now();
    let event = env
        .wait_failed("p1", &sched, |e| {
            e.message
                .as_deref()
                .is_some_and(|m| m.contains("httpTimeout"))
        })
        .await?;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "gave up before the reply"
    );
    assert!(
        event
            .message
            .as_deref()
            .unwrap_or_default()
            .contains(&format!("{}/filter", ext.url)),
        "{:?}",
        event.message
    );
    Ok(())
}

/// A pod that fits nowhere is bound as soon as a node gains capacity:
/// the node update retries it at once, well before its back-off (10 s here)
/// would, with no scheduler restart.
#[tokio::test(flavor = "multi_thread")]
async fn a_pod_is_scheduled_when_a_node_gains_capacity() -> Result<()> {
    prerequisites!();
    let env = Env::new().await?;
    env.add_node("n1", 0, json!({})).await?;
    let mut config: Value = serde_json::from_str(&scheduler_config(json!([])))?;
    config["podInitialBackoffSeconds"] = json!(10);
    config["podMaxBackoffSeconds"] = json!(10);
    let sched = env.scheduler(&config.to_string())?;
    env.add_pod("p1", 1).await?;
    env.wait_failed("p1", &sched, |e| {
        e.message.as_deref().is_some_and(|m| {
            m.starts_with("0/1 nodes are available: 1 Insufficient example.com/dev.")
        })
    })
    .await?;
    let changed = Instant::now();
    env.set_devices("n1", 1).await?;
    assert_eq!(env.wait_bound("p1", &sched).await?, "n1");
    assert!(
        changed.elapsed() < Duration::from_secs(5),
        "bound {:?} after the node change: not retried at once",
        changed.elapsed()
    );
    Ok(())
}

/// Prioritize scores count × weight: a weight-5 extender's preference beats
/// a weight-1 extender's stronger one (the same scores at equal weights
/// would pick n1).
#[tokio::test(flavor = "multi_thread")]
async fn prioritize_weights_pick_the_node() -> Result<()> {
    prerequisites!();
    let env = Env::new().await?;
    for n in ["n1", "n2", "n3"] {
        env.add_node(n, 4, json!({})).await?;
    }
    let scores_a = json!([{"Host": "n1", "Score": 10}, {"Host": "n2", "Score": 5}, {"Host": "n3", "Score": 0}]);
    let scores_b =
        json!([{"Host": "n1", "Score": 0}, {"Host": "n2", "Score": 2}, {"Host": "n3", "Score": 4}]);
    let a = FakeExtender::start(handler(move |_, _| {
        let s = scores_a.clone();
        Box::pin(async move { (200, s) })
    }))
    .await?;
    let b = FakeExtender::start(handler(move |_, _| {
        let s = scores_b.clone();
        Box::pin(async move { (200, s) })
    }))
    .await?;
    let sched = env.scheduler(&scheduler_config(json!([
        {"urlPrefix": a.url, "prioritizeVerb": "prioritize", "weight": 1},
        {"urlPrefix": b.url, "prioritizeVerb": "prioritize", "weight": 5, "nodeCacheCapable": true},
    ])))?;
    env.add_pod("p1", 1).await?;
    // n1: 10×1 = 10, n2: 5×1 + 2×5 = 15, n3: 0×1 + 4×5 = 20 (× 10 each).
    assert_eq!(env.wait_bound("p1", &sched).await?, "n3");
    assert_eq!(
        names_sent(&a.requests("prioritize")[0].body),
        vec!["n1", "n2", "n3"]
    );
    assert_eq!(
        b.requests("prioritize")[0].body["NodeNames"],
        json!(["n1", "n2", "n3"])
    );
    Ok(())
}

/// A filter reply naming a node that was not sent is an error.
#[tokio::test(flavor = "multi_thread")]
async fn a_reply_naming_an_unsent_node_is_an_error() -> Result<()> {
    prerequisites!();
    let env = Env::new().await?;
    env.add_node("n1", 1, json!({})).await?;
    let ext = FakeExtender::start(handler(|_, _| {
        Box::pin(async move { (200, json!({"NodeNames": ["n1", "ghost"]})) })
    }))
    .await?;
    let sched = env.scheduler(&scheduler_config(json!([{
        "urlPrefix": ext.url, "filterVerb": "filter", "nodeCacheCapable": true,
    }])))?;
    env.add_pod("p1", 1).await?;
    let event = env
        .wait_failed("p1", &sched, |e| {
            e.message
                .as_deref()
                .is_some_and(|m| m.contains("\"ghost\""))
        })
        .await?;
    assert!(
        event
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("not found in the input node list"),
        "{:?}",
        event.message
    );
    assert_eq!(env.node_of("p1").await?, None);
    Ok(())
}

/// Pods pending while no scheduler runs, or left by a crashed one, are
/// scheduled by the next scheduler started (YAML config this time).
#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_scheduler_picks_up_pending_pods() -> Result<()> {
    prerequisites!();
    let env = Env::new().await?;
    env.add_node("n1", 0, json!({})).await?;
    let yaml = format!(
        "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nprofiles:\n  - schedulerName: {SCHED}\n"
    );
    let mut first = env.scheduler(&yaml)?;
    env.add_pod("p1", 1).await?;
    env.wait_failed("p1", &first, |_| true).await?;
    first.kill();
    env.add_pod("p2", 1).await?;
    env.set_devices("n1", 2).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        env.node_of("p1").await?,
        None,
        "nobody schedules while the scheduler is down"
    );
    let second = env.scheduler(&yaml)?;
    assert_eq!(env.wait_bound("p1", &second).await?, "n1");
    assert_eq!(env.wait_bound("p2", &second).await?, "n1");
    drop(second);
    Ok(())
}

/// 50 pods created at once: every one bound exactly once (the extender's
/// bind log), no node over its capacity.
#[tokio::test(flavor = "multi_thread")]
async fn fifty_pods_at_once_are_each_bound_exactly_once() -> Result<()> {
    prerequisites!();
    let env = Env::new().await?;
    let nodes = ["n1", "n2", "n3", "n4"];
    for n in nodes {
        env.add_node(n, 13, json!({})).await?;
    }
    let ext = FakeExtender::start(binding_handler(env.client.clone(), pass_all)).await?;
    let sched = env.scheduler(&scheduler_config(json!([{
        "urlPrefix": ext.url, "filterVerb": "filter", "bindVerb": "bind",
        "nodeCacheCapable": true, "managedResources": [{"name": DEV}],
    }])))?;
    let created: Vec<Pod> = futures::future::try_join_all((0..50).map(|i| {
        let env = &env;
        async move { env.add_pod(&format!("p{i:02}"), 1).await }
    }))
    .await?;
    let mut bound: BTreeMap<String, String> = BTreeMap::new();
    for p in &created {
        let name = p.metadata.name.clone().unwrap_or_default();
        let node = env.wait_bound(&name, &sched).await?;
        bound.insert(name, node);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let binds = ext.requests("bind");
    let uids: BTreeSet<&str> = binds
        .iter()
        .filter_map(|b| b.body["PodUID"].as_str())
        .collect();
    assert_eq!(binds.len(), 50, "one bind per pod");
    assert_eq!(uids.len(), 50, "no pod bound twice");
    for b in &binds {
        let name = b.body["PodName"].as_str().unwrap_or_default();
        assert_eq!(
            b.body["Node"].as_str(),
            bound.get(name).map(String::as_str),
            "{name}"
        );
    }
    let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
    for node in bound.values() {
        *per_node.entry(node).or_default() += 1;
    }
    assert!(
        per_node.values().all(|&n| n <= 13),
        "capacity respected: {per_node:?}"
    );
    Ok(())
}

/// An extender with managedResources is asked only about pods that request
/// one of them; pods of another scheduler are left alone.
#[tokio::test(flavor = "multi_thread")]
async fn only_interested_extenders_and_our_profiles_pods() -> Result<()> {
    prerequisites!();
    let env = Env::new().await?;
    env.add_node("n1", 2, json!({})).await?;
    let ext =
        FakeExtender::start(handler(|v, b| Box::pin(async move { pass_all(&v, &b) }))).await?;
    let sched = env.scheduler(&scheduler_config(json!([{
        "urlPrefix": ext.url, "filterVerb": "filter", "nodeCacheCapable": true,
        "managedResources": [{"name": DEV, "ignoredByScheduler": false}],
    }])))?;
    env.add_pod("with-dev", 1).await?;
    env.add_pod("without-dev", 0).await?;
    let mut other: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "other", "namespace": NS},
        "spec": {"schedulerName": "someone-else", "containers": [{"name": "c", "image": "busybox"}]},
    }))?;
    other = env.pods().create(&PostParams::default(), &other).await?;
    assert_eq!(env.wait_bound("with-dev", &sched).await?, "n1");
    assert_eq!(env.wait_bound("without-dev", &sched).await?, "n1");
    let asked: Vec<Value> = ext
        .requests("filter")
        .iter()
        .map(|r| r.body["Pod"]["metadata"]["name"].clone())
        .collect();
    assert_eq!(asked, vec![json!("with-dev")]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(env.node_of("other").await?, None);
    assert!(env.events_of("other", "FailedScheduling").await?.is_empty());
    assert!(other.metadata.uid.is_some());
    Ok(())
}

/// The API server restarts (same address, state kept) under a running
/// scheduler: its watches reconnect and scheduling goes on; the pod bound
/// before stays where it was.
#[tokio::test(flavor = "multi_thread")]
async fn scheduling_goes_on_across_an_api_server_restart() -> Result<()> {
    prerequisites!();
    let port = tessera_test_support::free_port();
    let state_dir = tempfile::tempdir()?;
    let state = state_dir.path().join("state.json");
    let listen = format!("127.0.0.1:{port}");
    let server = tkube::StandInApiServer::start(&[
        "--listen",
        &listen,
        "--state",
        state.to_str().context("state path")?,
    ])?;
    let client = tkube::client(server.kubeconfig()).await?;
    let mut env = Env {
        cluster: Cluster::StandIn(server),
        client,
        dir: tempfile::Builder::new()
            .prefix("tessera-scheduler-")
            .tempdir()?,
    };
    env.add_node("n1", 4, json!({})).await?;
    let sched = env.scheduler(&scheduler_config(json!([])))?;
    env.add_pod("p1", 1).await?;
    assert_eq!(env.wait_bound("p1", &sched).await?, "n1");

    env.cluster.stand_in().context("stand-in")?.restart()?;
    env.client = tkube::client(env.cluster.kubeconfig()).await?;
    env.add_pod("p2", 1).await?;
    assert_eq!(env.wait_bound("p2", &sched).await?, "n1");
    assert_eq!(env.node_of("p1").await?.as_deref(), Some("n1"));
    assert!(env.events_of("p1", "FailedScheduling").await?.is_empty());
    Ok(())
}

/// A pod requesting absurd amounts (two containers of about i128::MAX / 1000
/// cpu each, where milli-unit sums overflow) neither crashes the scheduler,
/// at its first list or later, nor keeps other pods from being scheduled.
#[tokio::test(flavor = "multi_thread")]
async fn absurd_quantities_do_not_stop_the_scheduler() -> Result<()> {
    prerequisites!();
    let env = Env::new().await?;
    env.add_node("n1", 2, json!({})).await?;
    let huge = "170141183460469231731687303715884105";
    let container = |name: &str| json!({"name": name, "image": "busybox", "resources": {"requests": {"cpu": huge}}});
    let absurd: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "absurd", "namespace": NS},
        "spec": {"schedulerName": SCHED, "containers": [container("a"), container("b")]},
    }))?;
    env.pods().create(&PostParams::default(), &absurd).await?;
    let mut sched = env.scheduler(&scheduler_config(json!([])))?;
    env.add_pod("p1", 1).await?;
    assert_eq!(env.wait_bound("p1", &sched).await?, "n1");
    let event = env.wait_failed("absurd", &sched, |_| true).await?;
    assert_eq!(
        event.message.as_deref(),
        Some(
            "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available: \
             1 No preemption victims found for incoming pod."
        )
    );
    // A second such pod, seen through the watch this time.
    let mut again = absurd.clone();
    again.metadata.name = Some("absurd2".into());
    env.pods().create(&PostParams::default(), &again).await?;
    env.wait_failed("absurd2", &sched, |_| true).await?;
    env.add_pod("p2", 1).await?;
    assert_eq!(env.wait_bound("p2", &sched).await?, "n1");
    assert!(sched.is_running(), "crashed:\n{}", sched.log_text());
    Ok(())
}

/// A pod with scheduling gates is left alone, its PodScheduled condition
/// saying why (reason SchedulingGated) and no FailedScheduling event; once
/// the gates are removed it is scheduled.
#[tokio::test(flavor = "multi_thread")]
async fn a_gated_pod_waits_for_its_gates() -> Result<()> {
    prerequisites!();
    let env = Env::new().await?;
    env.add_node("n1", 1, json!({})).await?;
    let sched = env.scheduler(&scheduler_config(json!([])))?;
    let gated: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "gated", "namespace": NS},
        "spec": {
            "schedulerName": SCHED,
            "schedulingGates": [{"name": "example.com/wait"}],
            "containers": [{"name": "c", "image": "busybox"}],
        },
    }))?;
    env.pods().create(&PostParams::default(), &gated).await?;
    let want = Some((
        "False".to_owned(),
        "SchedulingGated".to_owned(),
        "Scheduling is blocked due to non-empty scheduling gates".to_owned(),
    ));
    let (env, want) = (&env, &want);
    let gated_condition = poll(|| async move {
        Ok((env.pod_scheduled_condition("gated").await? == *want).then_some(()))
    })
    .await?;
    ensure!(
        gated_condition.is_some(),
        "condition {:?}; log:\n{}",
        env.pod_scheduled_condition("gated").await?,
        sched.log_text()
    );
    // An ungated pod created after it is scheduled meanwhile.
    env.add_pod("free", 0).await?;
    env.wait_bound("free", &sched).await?;
    assert_eq!(env.node_of("gated").await?, None);
    assert!(env.events_of("gated", "FailedScheduling").await?.is_empty());
    env.pods()
        .patch(
            "gated",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"schedulingGates": null}})),
        )
        .await?;
    assert_eq!(env.wait_bound("gated", &sched).await?, "n1");
    Ok(())
}

/// The scheduler sets PodScheduled without touching other conditions, even
/// one added while it was trying the pod (its copy of the pod is older).
#[tokio::test(flavor = "multi_thread")]
async fn the_pod_scheduled_condition_leaves_other_conditions_alone() -> Result<()> {
    prerequisites!();
    let env = Env::new().await?;
    env.add_node("n1", 1, json!({})).await?;
    let added = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let client = env.client.clone();
    // During the first filter call, another writer adds a condition.
    let ext = FakeExtender::start(handler(move |_verb, body| {
        let (client, added) = (client.clone(), added.clone());
        Box::pin(async move {
            if !added.swap(true, std::sync::atomic::Ordering::SeqCst) {
                let name = body["Pod"]["metadata"]["name"].as_str().unwrap_or_default();
                let api: Api<Pod> = Api::namespaced(client, NS);
                let condition = json!({"status": {"conditions": [
                    {"type": "example.com/Checked", "status": "True"},
                ]}});
                if let Err(e) = api
                    .patch_status(name, &PatchParams::default(), &Patch::Strategic(&condition))
                    .await
                {
                    eprintln!("adding the condition: {e}");
                }
            }
            (
                200,
                json!({"NodeNames": [], "FailedNodes": {"n1": "not now"}}),
            )
        })
    }))
    .await?;
    let sched = env.scheduler(&scheduler_config(json!([{
        "urlPrefix": ext.url, "filterVerb": "filter", "nodeCacheCapable": true,
    }])))?;
    env.add_pod("p1", 1).await?;
    let want = "0/1 nodes are available: 1 not now. preemption: 0/1 nodes are available: \
                1 No preemption victims found for incoming pod.";
    let env = &env;
    let condition = poll(|| async move {
        let message = env.pod_scheduled_condition("p1").await?.map(|c| c.2);
        Ok((message.as_deref() == Some(want)).then_some(()))
    })
    .await?;
    ensure!(
        condition.is_some(),
        "no PodScheduled condition; log:\n{}",
        sched.log_text()
    );
    let types: BTreeSet<String> = env
        .pods()
        .get("p1")
        .await?
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.type_)
        .collect();
    assert_eq!(
        types,
        BTreeSet::from(["PodScheduled".to_owned(), "example.com/Checked".to_owned()])
    );
    Ok(())
}

/// A bad configuration stops the binary with one line naming the field.
#[test]
fn a_bad_config_is_one_line_naming_the_field() -> Result<()> {
    let Ok(()) = require(&[tessera_test_support::Need::Built("tessera-sim")]) else {
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let cases = [
        (
            "extenders:\n  - urlPrefix: http://127.0.0.1:1\n    bindverb: bind\n",
            "extenders[0].bindverb: unknown field",
        ),
        (
            "extenders:\n  - urlPrefix: http://127.0.0.1:1\n    prioritizeVerb: p\n",
            "extenders[0].weight: must be greater than 0",
        ),
        (
            "extenders:\n  - urlPrefix: http://127.0.0.1:1\n    enableHTTPS: true\n",
            "extenders[0].enableHTTPS: not supported",
        ),
    ];
    for (i, (body, want)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("bad{i}.yaml"));
        std::fs::write(
            &path,
            format!(
                "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n{body}"
            ),
        )?;
        let out = Command::new(tessera_test_support::artefact("tessera-sim"))
            .args(["scheduler", "--config"])
            .arg(&path)
            .output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{body}");
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
        assert!(stderr.contains(want), "{stderr} lacks {want}");
    }
    Ok(())
}

/// SIGTERM stops the scheduler cleanly (exit 0).
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_stops_the_scheduler_cleanly() -> Result<()> {
    prerequisites!();
    let env = Env::new().await?;
    let mut sched = env.scheduler(&scheduler_config(json!([])))?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let status = sched.stop().context("was running")?;
    assert!(status.success(), "{status:?}\n{}", sched.log_text());
    Ok(())
}
