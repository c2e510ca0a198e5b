//! What the extender's integration tests share: a stand-in API server, Node
//! objects carrying `tessera.io/node-gpus` built from catalogue models, pods
//! asking for GPUs, the extender binary as a child process, a tiny HTTP
//! client, and a stand-in for the device plugin's end of the bind protocol.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Container, Node, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Api;
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tessera_model::contract::annotations;
use tessera_model::mig::catalogue;
use tessera_model::sched::inventory::{NODE_GPUS_VERSION, NodeGpu, NodeGpus};
use tessera_test_support::kube::StandInApiServer;
use tessera_test_support::require;

/// The stand-in API server and a client for it; `None` when the test must
/// skip (the prerequisite rule said so).
pub async fn api() -> Option<(StandInApiServer, kube::Client)> {
    require(&tessera_test_support::kube::needs()).ok()?;
    let server = StandInApiServer::start(&[]).expect("stand-in API server starts");
    let client = tessera_test_support::kube::client(server.kubeconfig())
        .await
        .expect("client");
    Some((server, client))
}

/// A share-mode GPU (MIG off) of a catalogue model.
pub fn share_gpu(model: &str, index: u32) -> NodeGpu {
    let spec = catalogue::find(model).expect("catalogue model");
    NodeGpu::from_catalogue(spec, index, format!("GPU-{model}-{index}-0000"), false)
        .expect("whole GPU")
}

/// A MIG-mode GPU of a catalogue model, reporting the catalogue's profiles.
pub fn mig_gpu(model: &str, index: u32) -> NodeGpu {
    let spec = catalogue::find(model).expect("catalogue model");
    NodeGpu::from_catalogue(spec, index, format!("GPU-{model}-{index}-0001"), true)
        .expect("a MIG model")
}

/// The annotation text of an inventory.
pub fn inventory(gpus: Vec<NodeGpu>) -> String {
    NodeGpus {
        version: NODE_GPUS_VERSION,
        gpus,
    }
    .to_annotation()
}

/// Creates a Node, with `tessera.io/node-gpus` = `node_gpus` when given.
pub async fn put_node(client: &kube::Client, name: &str, node_gpus: Option<&str>) -> Node {
    let mut meta = ObjectMeta {
        name: Some(name.into()),
        ..Default::default()
    };
    if let Some(text) = node_gpus {
        meta.annotations = Some(BTreeMap::from([(
            annotations::NODE_GPUS.to_string(),
            text.to_string(),
        )]));
    }
    Api::<Node>::all(client.clone())
        .create(
            &PostParams::default(),
            &Node {
                metadata: meta,
                ..Default::default()
            },
        )
        .await
        .expect("node created")
}

/// Creates a Node with `gpus` A100-40GB in share mode, indexes from 0
/// (uuids `GPU-A100-40GB-<index>-0000`).
pub async fn put_share_node(client: &kube::Client, name: &str, gpus: u32) -> Node {
    let gpus = (0..gpus)
        .map(|index| share_gpu("A100-40GB", index))
        .collect();
    put_node(client, name, Some(&inventory(gpus))).await
}

/// The allocation text of one share device of `mib` (no cores) on `node`'s
/// A100-40GB 0, as the extender writes it.
pub fn share_allocation(node: &str, mib: u64) -> String {
    json!({"version": 1, "node": node, "containers": [{"index": 0, "name": "main", "devices": [
        {"mode": "share", "uuid": "GPU-A100-40GB-0-0000", "memoryMiB": mib, "cores": 0}]}]})
    .to_string()
}

/// A pod in `default` with one container asking `gpus` GPUs of `memory_mib`
/// each (and `cores` when given), plus `extra` annotations.
pub fn gpu_pod(
    name: &str,
    gpus: u32,
    memory_mib: u64,
    cores: Option<u32>,
    extra: &[(&str, &str)],
) -> Pod {
    let mut limits = BTreeMap::from([
        ("nvidia.com/gpu".to_string(), Quantity(gpus.to_string())),
        (
            "nvidia.com/gpumem".to_string(),
            Quantity(memory_mib.to_string()),
        ),
    ]);
    if let Some(cores) = cores {
        limits.insert("nvidia.com/gpucores".into(), Quantity(cores.to_string()));
    }
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            annotations: Some(
                extra
                    .iter()
                    .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                    .collect(),
            ),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "main".into(),
                image: Some("busybox".into()),
                resources: Some(ResourceRequirements {
                    limits: Some(limits),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A pod asking for no GPU.
pub fn plain_pod(name: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "main".into(),
                image: Some("busybox".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Creates a pod and returns it as the server stored it (with its uid).
pub async fn put_pod(client: &kube::Client, pod: &Pod) -> Pod {
    Api::<Pod>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), pod)
        .await
        .expect("pod created")
}

/// Reads a pod back.
pub async fn get_pod(client: &kube::Client, name: &str) -> Pod {
    Api::<Pod>::namespaced(client.clone(), "default")
        .get(name)
        .await
        .expect("pod read")
}

/// One annotation of a pod.
pub fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// The node a pod is bound to.
pub fn node_of(pod: &Pod) -> Option<String> {
    pod.spec.as_ref().and_then(|s| s.node_name.clone())
}

/// The `Error` of an extender reply (empty when none).
pub fn error_of(reply: &Value) -> &str {
    reply["Error"].as_str().unwrap_or("")
}

/// The holder of `node`'s bind Lease in `kube-system`; `None` when the Lease
/// is absent or free.
pub async fn lease_holder(client: &kube::Client, node: &str) -> Option<String> {
    Api::<Lease>::namespaced(client.clone(), "kube-system")
        .get_opt(&format!("tessera-bind.{node}"))
        .await
        .expect("lease read")
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty())
}

/// The Lease holder a bind of `pod` (in `default`) writes: `<ns>/<pod>/<uid>`,
/// spelled out here from the contract rather than by the code under test.
pub fn holder(pod: &Pod) -> String {
    format!(
        "default/{}/{}",
        pod.metadata.name.as_deref().unwrap_or(""),
        pod.metadata.uid.as_deref().unwrap_or("")
    )
}

/// `node`'s bind Lease held by `holder` for `seconds`, stamped `at`
/// (acquire and renew time), as another replica would have written it.
pub fn bind_lease(node: &str, holder: &str, seconds: i32, at: MicroTime) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(format!("tessera-bind.{node}")),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.to_string()),
            lease_duration_seconds: Some(seconds),
            acquire_time: Some(at.clone()),
            renew_time: Some(at),
            ..Default::default()
        }),
    }
}

/// The extender binary as a child process, serving on 127.0.0.1.
pub struct ExtenderProcess {
    child: Option<Child>,
    /// `http://127.0.0.1:<port>`'s host:port.
    pub address: String,
    log: PathBuf,
    /// Holds the log; removed after the process is stopped.
    _log_dir: tempfile::TempDir,
}

impl ExtenderProcess {
    /// Starts it with `--kubeconfig`, a fresh port, `extra` options, its log
    /// in a temporary directory of its own, and waits until `/readyz`
    /// answers 200.
    pub fn start(kubeconfig: &Path, extra: &[&str]) -> Result<ExtenderProcess> {
        let port = tessera_test_support::free_port();
        let address = format!("127.0.0.1:{port}");
        let log_dir = tempfile::tempdir()?;
        let log = log_dir.path().join(format!("extender-{port}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_tessera-scheduler-extender"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--listen", &address])
            .args(extra)
            .env("TESSERA_LOG", "debug,kube=info,hyper=info,tower=info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("spawning tessera-scheduler-extender")?;
        let mut process = ExtenderProcess {
            child: Some(child),
            address,
            log,
            _log_dir: log_dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(child) = process.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                bail!("extender exited with {status}:\n{}", process.log_text());
            }
            if let Ok((200, _)) = http(&process.address, "GET", "/readyz", "") {
                return Ok(process);
            }
            if Instant::now() > deadline {
                bail!("extender not ready in 20 s:\n{}", process.log_text());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// What it logged.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// POSTs a JSON body to a verb; returns status and parsed reply.
    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let (status, text) = http(&self.address, "POST", path, &body.to_string())
            .unwrap_or_else(|e| panic!("POST {path}: {e}\n{}", self.log_text()));
        let value = serde_json::from_str(&text).unwrap_or_else(|e| {
            panic!(
                "POST {path}: reply {text:?} is not JSON: {e}\n{}",
                self.log_text()
            )
        });
        (status, value)
    }

    /// `POST /bind` of `pod` to `node`: the `ExtenderBindingResult`, which
    /// must come with 200.
    pub fn bind(&self, pod: &Pod, node: &str) -> Value {
        let (status, reply) = self.post("/bind", &binding_args(pod, node));
        assert_eq!(status, 200, "{reply}");
        reply
    }

    /// `POST /filter` of `pod` over the node names `nodes`
    /// (nodeCacheCapable): the `ExtenderFilterResult`, which must come with 200.
    pub fn filter(&self, pod: &Pod, nodes: &[&str]) -> Value {
        let (status, reply) = self.post("/filter", &args_with_names(pod, nodes));
        assert_eq!(status, 200, "{reply}");
        reply
    }

    /// Its `GET /metrics` text, which must be served (200).
    pub fn metrics(&self) -> String {
        let (status, text) = http(&self.address, "GET", "/metrics", "")
            .unwrap_or_else(|e| panic!("GET /metrics: {e}\n{}", self.log_text()));
        assert_eq!(status, 200, "GET /metrics: {text}");
        text
    }

    /// Stops it (SIGTERM, then SIGKILL).
    pub fn stop(&mut self) {
        if let Some(child) = self.child.take() {
            tessera_test_support::terminate(child, Duration::from_secs(5));
        }
    }
}

impl Drop for ExtenderProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One HTTP/1.1 request with `Connection: close`; returns status and body.
pub fn http(address: &str, method: &str, path: &str, body: &str) -> Result<(u16, String)> {
    let mut stream = TcpStream::connect(address)?;
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply)?;
    let reply = String::from_utf8_lossy(&reply).into_owned();
    let (head, body) = reply
        .split_once("\r\n\r\n")
        .context("no end of headers in the reply")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("no status in the reply")?;
    Ok((status, body.to_string()))
}

/// The `ExtenderArgs` kube-scheduler sends with nodeCacheCapable.
pub fn args_with_names(pod: &Pod, nodes: &[&str]) -> Value {
    json!({"Pod": pod, "NodeNames": nodes})
}

/// The `ExtenderBindingArgs` of a pod.
pub fn binding_args(pod: &Pod, node: &str) -> Value {
    json!({
        "PodName": pod.metadata.name,
        "PodNamespace": pod.metadata.namespace,
        "PodUID": pod.metadata.uid,
        "Node": node,
    })
}

/// Stands in for the device plugin's end of the protocol: every pod bound to
/// a node and in `bind-phase: allocating` is moved to `success`. Runs until
/// the returned task is aborted.
pub fn device_plugin_stand_in(client: kube::Client) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let pods: Api<Pod> = Api::all(client.clone());
        loop {
            if let Ok(list) = pods.list(&ListParams::default()).await {
                for pod in list.items {
                    let bound = pod
                        .spec
                        .as_ref()
                        .and_then(|s| s.node_name.as_ref())
                        .is_some();
                    if bound && annotation(&pod, annotations::BIND_PHASE) == Some("allocating") {
                        let ns = pod.metadata.namespace.clone().unwrap_or_default();
                        let name = pod.metadata.name.clone().unwrap_or_default();
                        let patch = json!({"metadata": {"annotations": {annotations::BIND_PHASE: "success"}}});
                        let _ = Api::<Pod>::namespaced(client.clone(), &ns)
                            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                            .await;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
}

/// Waits until `check` holds (polling), or fails with `what`.
pub async fn eventually<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A reverse proxy in front of the API server that forwards everything
/// (watches stream through) except what a test tells it to fail: while
/// `fail_bindings` is set, `POST …/binding` is answered 500 (not made);
/// while `lose_binding_replies` is set, it is made but answered 500; once a
/// Binding was failed or its reply lost while `blind_after_binding` is set,
/// single-pod reads (`GET …/pods/<name>`) are answered 500 until
/// `pod_reads_fail` is cleared.
pub struct FaultyApi {
    /// A kubeconfig naming the proxy.
    pub kubeconfig: PathBuf,
    /// Fail Binding creates while set.
    pub fail_bindings: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Make Binding creates but answer 500 while set.
    pub lose_binding_replies: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Start failing pod reads at the next failed Binding while set.
    pub blind_after_binding: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Pod reads fail while set.
    pub pod_reads_fail: std::sync::Arc<std::sync::atomic::AtomicBool>,
    _dir: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FaultyApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Sets or clears one of a [`FaultyApi`]'s faults.
pub fn set_fault(flag: &std::sync::atomic::AtomicBool, on: bool) {
    flag.store(on, std::sync::atomic::Ordering::SeqCst);
}

impl FaultyApi {
    /// Starts one in front of `server`.
    pub async fn start(server: &StandInApiServer) -> FaultyApi {
        use axum::body::Body;
        use axum::extract::Request;
        use hyper_util::client::legacy::Client;
        use hyper_util::rt::TokioExecutor;
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};

        let upstream = server.url().expect("API server URL");
        let fail_bindings = Arc::new(AtomicBool::new(false));
        let lose_binding_replies = Arc::new(AtomicBool::new(false));
        let blind_after_binding = Arc::new(AtomicBool::new(false));
        let pod_reads_fail = Arc::new(AtomicBool::new(false));
        let flags = (
            fail_bindings.clone(),
            lose_binding_replies.clone(),
            blind_after_binding.clone(),
            pod_reads_fail.clone(),
        );
        let http_client: Client<_, Body> = Client::builder(TokioExecutor::new()).build_http();
        let injected = || {
            let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "message": "injected failure", "reason": "InternalError", "code": 500});
            axum::response::Response::builder()
                .status(500)
                .header("content-type", "application/json")
                .body(Body::from(status.to_string()))
                .expect("response")
        };
        let handler = move |request: Request| {
            let http_client = http_client.clone();
            let upstream = upstream.clone();
            let (fail, lose, blind, reads) = flags.clone();
            async move {
                let (mut parts, body) = request.into_parts();
                let binding = parts.method == axum::http::Method::POST
                    && parts.uri.path().ends_with("/binding");
                if binding && fail.load(Ordering::SeqCst) {
                    if blind.load(Ordering::SeqCst) {
                        reads.store(true, Ordering::SeqCst);
                    }
                    return injected();
                }
                // GET /api/v1/namespaces/<ns>/pods/<name>
                let segments: Vec<&str> = parts.uri.path().split('/').collect();
                if parts.method == axum::http::Method::GET
                    && segments.len() == 7
                    && segments[5] == "pods"
                    && reads.load(Ordering::SeqCst)
                {
                    return injected();
                }
                let lost = binding && lose.load(Ordering::SeqCst);
                let path = parts
                    .uri
                    .path_and_query()
                    .map(|p| p.as_str().to_string())
                    .unwrap_or_default();
                parts.uri = format!("{}{path}", upstream.trim_end_matches('/'))
                    .parse()
                    .expect("upstream URI");
                parts.headers.remove(axum::http::header::HOST);
                match http_client
                    .request(axum::http::Request::from_parts(parts, body))
                    .await
                {
                    Ok(_) if lost => {
                        if blind.load(Ordering::SeqCst) {
                            reads.store(true, Ordering::SeqCst);
                        }
                        injected()
                    }
                    Ok(reply) => reply.map(Body::new),
                    Err(e) => axum::response::Response::builder()
                        .status(502)
                        .body(Body::from(e.to_string()))
                        .expect("response"),
                }
            }
        };
        let app = axum::Router::new().fallback(handler);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind proxy");
        let address = listener.local_addr().expect("address");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = dir.path().join("kubeconfig");
        let text = std::fs::read_to_string(server.kubeconfig()).expect("kubeconfig");
        let upstream = server.url().expect("API server URL");
        std::fs::write(
            &kubeconfig,
            text.replace(&upstream, &format!("http://{address}")),
        )
        .expect("write kubeconfig");
        FaultyApi {
            kubeconfig,
            fail_bindings,
            lose_binding_replies,
            blind_after_binding,
            pod_reads_fail,
            _dir: dir,
            task,
        }
    }
}
