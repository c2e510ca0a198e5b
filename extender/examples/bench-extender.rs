//! Benchmark driver of the scheduler extender (run by
//! `scripts/bench-extender.sh`, which starts the stand-in API server, the
//! extender and the baseline): real processes over HTTP.
//!
//! ```text
//! bench-extender free-port
//! bench-extender populate --kubeconfig F [--nodes 1000] [--pods 5000] [--bind-pods 2000]
//! bench-extender serve-baseline --kubeconfig F --address-out FILE
//! bench-extender measure --kubeconfig F --extender URL --baseline URL [--nodes 1000]
//!     [--pods 5000] [--requests 500] [--bind-pods 2000] [--concurrency 32]
//! ```
//!
//! `populate` writes what the device plugin and earlier binds would have:
//! nodes `node-1` … with 8 A100-40GB each in `tessera.io/node-gpus` (GPUs 0-5
//! shared, 6-7 in MIG mode), placed pods with `tessera.io/allocation` (per
//! node, in turn: share slices on GPUs 0, 1, 0, a 3g.20gb at slots 0-3 of
//! GPU 6, a 1g.5gb at slot 0 of GPU 7; `bind-phase: success`), and pending
//! pods for the bind runs (even ones ask for a 4000 MiB share slice, odd
//! ones for a 4000 MiB MIG instance, checked afterwards to hold exactly
//! that). `serve-baseline` is the trivial extender the
//! figures are set against: it parses each request as JSON and accepts every
//! node (filter), scores each 0 (prioritize), and posts the Binding alone
//! (bind). `measure` sends /filter and /prioritize with every node name
//! (nodeCacheCapable) sequentially on one keep-alive connection to both,
//! then binds pods through each with `--concurrency` connections, while a
//! stand-in device-plugin loop sets `bind-phase: success` on every pod the
//! extender leaves `allocating` (so a node's bind lock comes free for its
//! next pod); it prints the table and exits non-zero when a figure is
//! missing or an answer is wrong.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use clap::{Args, Parser, Subcommand};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Binding, Namespace, Node, ObjectReference, Pod};
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::{Value, json};
use tessera_model::contract::{annotations, resources};
use tessera_model::mig::catalogue;
use tessera_model::mig::placement::Placement;
use tessera_model::sched::allocation::{
    Allocation, ContainerAllocation, DeviceAllocation, Realized,
};
use tessera_model::sched::inventory::{NODE_GPUS_VERSION, NodeGpu, NodeGpus};
use tokio::net::TcpStream;

/// Where the benchmark's pods live.
const NAMESPACE: &str = "tessera-bench";
/// Label of every benchmark pod: `placed`, `bind` (bound through the
/// extender) or `base` (bound through the baseline).
const ROLE_LABEL: &str = "tessera.io/bench-role";
/// GPUs per node, and which of them are in MIG mode.
const GPUS_PER_NODE: u32 = 8;
const FIRST_MIG_GPU: u32 = 6;
/// Placed pods per node the layout below has room for.
const PLACED_PER_NODE: usize = 5;
/// API writes in flight while populating.
const POPULATE_WORKERS: usize = 16;
/// Sequential requests sent before the measured ones (connection, caches).
const WARMUP: usize = 20;
/// How long `measure` waits for the extender's `/readyz`.
const READY_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Parser)]
#[command(about = "Benchmark driver of tessera-scheduler-extender")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Prints a free TCP port on 127.0.0.1.
    FreePort,
    /// Writes nodes, placed pods and pending pods into the API server.
    Populate(PopulateArgs),
    /// Runs the trivial baseline extender.
    ServeBaseline(BaselineArgs),
    /// Measures the extender and the baseline; prints the table.
    Measure(MeasureArgs),
}

#[derive(Args)]
struct Scale {
    /// Nodes `node-1` … `node-N`.
    #[arg(long, default_value_t = 1000)]
    nodes: usize,
    /// Pods already placed (at most 5 per node).
    #[arg(long, default_value_t = 5000)]
    pods: usize,
    /// Pending pods bound in each bind run (through the extender, and
    /// again through the baseline).
    #[arg(long, default_value_t = 2000)]
    bind_pods: usize,
}

#[derive(Args)]
struct PopulateArgs {
    /// The API server's kubeconfig.
    #[arg(long)]
    kubeconfig: PathBuf,
    #[command(flatten)]
    scale: Scale,
}

#[derive(Args)]
struct BaselineArgs {
    /// The API server's kubeconfig (for bind).
    #[arg(long)]
    kubeconfig: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// Where to write the address actually bound.
    #[arg(long)]
    address_out: PathBuf,
}

#[derive(Args)]
struct MeasureArgs {
    /// The API server's kubeconfig.
    #[arg(long)]
    kubeconfig: PathBuf,
    /// The extender, e.g. `http://127.0.0.1:31993`.
    #[arg(long)]
    extender: String,
    /// The baseline extender.
    #[arg(long)]
    baseline: String,
    #[command(flatten)]
    scale: Scale,
    /// Measured requests per verb and extender.
    #[arg(long, default_value_t = 500)]
    requests: usize,
    /// Binds in flight at once.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
}

#[tokio::main]
async fn main() -> Result<()> {
    match Cli::parse().command {
        Command::FreePort => {
            let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
            println!("{}", listener.local_addr()?.port());
            Ok(())
        }
        Command::Populate(args) => populate(args).await,
        Command::ServeBaseline(args) => serve_baseline(args).await,
        Command::Measure(args) => measure(args).await,
    }
}

async fn client(kubeconfig: &PathBuf) -> Result<kube::Client> {
    let config = kube::config::Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    let config =
        kube::Config::from_custom_kubeconfig(config, &kube::config::KubeConfigOptions::default())
            .await?;
    Ok(kube::Client::try_from(config)?)
}

// ---------------------------------------------------------------------------
// The cluster's contents.

fn node_name(i: usize) -> String {
    format!("node-{}", i + 1)
}

fn gpu_uuid(node: usize, gpu: u32) -> String {
    format!("GPU-{:08x}-{gpu:04x}-4000-8000-000000000000", node + 1)
}

/// A node's inventory as the device plugin would write it: 8 A100-40GB,
/// the last two in MIG mode with the profiles and placements NVML reports.
fn inventory(node: usize) -> Result<NodeGpus> {
    let model = catalogue::find("A100-40GB").context("A100-40GB is not in the catalogue")?;
    let gpus = (0..GPUS_PER_NODE)
        .map(|index| {
            NodeGpu::from_catalogue(model, index, gpu_uuid(node, index), index >= FIRST_MIG_GPU)
                .context("A100-40GB has no MIG spec")
        })
        .collect::<Result<_>>()?;
    let inventory = NodeGpus {
        version: NODE_GPUS_VERSION,
        gpus,
    };
    inventory.validate()?;
    Ok(inventory)
}

fn node_object(i: usize) -> Result<Node> {
    let name = node_name(i);
    let gpus = (GPUS_PER_NODE * 10).to_string();
    Ok(serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name},
            "annotations": {annotations::NODE_GPUS: inventory(i)?.to_annotation()},
        },
        "status": {
            "capacity": {"cpu": "64", "memory": "512Gi", "pods": "250", resources::GPU: gpus},
            "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "250", resources::GPU: gpus},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }))?)
}

/// A pod with one container asking for one GPU (`cores` 0: none named).
fn pod_object(name: &str, role: &str, memory_mib: u64, cores: u32, mode: &str) -> Value {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": NAMESPACE,
            "labels": {ROLE_LABEL: role},
            "annotations": {annotations::VGPU_MODE: mode},
        },
        "spec": {"containers": [{"name": "main", "image": "busybox",
            "resources": {"limits": {
                resources::GPU: "1",
                resources::GPU_MEMORY: memory_mib.to_string(),
            }}}]},
    });
    if cores > 0 {
        pod["spec"]["containers"][0]["resources"]["limits"][resources::GPU_CORES] =
            json!(cores.to_string());
    }
    pod
}

/// The `k`-th pod placed on node `node` (`k` < 5): what it asked for and
/// the device the extender reserved for it. Slots worked out by hand from
/// mig.md (A100-40GB: 3g.20gb is id 9 at starts {0,4} size 4, 1g.5gb is
/// id 19 at starts 0-6 size 1).
fn placed_device(node: usize, k: usize) -> (u64, u32, &'static str, DeviceAllocation) {
    let share = |gpu: u32, memory_mib: u64, cores: u32| {
        (
            memory_mib,
            cores,
            "share",
            DeviceAllocation::Share {
                uuid: gpu_uuid(node, gpu),
                memory_mib,
                cores,
            },
        )
    };
    let mig = |gpu: u32, request: u64, profile: &str, id: u32, start, size, memory_mib, gi| {
        (
            request,
            0,
            "mig",
            DeviceAllocation::Mig {
                uuid: gpu_uuid(node, gpu),
                profile: profile.to_owned(),
                profile_id: id,
                placement: Placement { start, size },
                memory_mib,
                realized: Some(Realized {
                    mig_uuid: format!("MIG-{:08x}-{gpu:04x}-4000-8000-{start:012x}", node + 1),
                    gpu_instance_id: gi,
                    compute_instance_id: 0,
                }),
            },
        )
    };
    match k {
        0 => share(0, 8000, 25),
        1 => share(1, 16000, 50),
        2 => share(0, 4000, 10),
        3 => mig(6, 20000, "3g.20gb", 9, 0, 4, 20096, 1),
        _ => mig(7, 4000, "1g.5gb", 19, 0, 1, 4864, 7),
    }
}

fn placed_pod(j: usize, nodes: usize) -> Result<Pod> {
    let (node, k) = (j % nodes, j / nodes);
    let (memory_mib, cores, mode, device) = placed_device(node, k);
    let allocation = Allocation {
        version: 1,
        node: node_name(node),
        containers: vec![ContainerAllocation {
            index: 0,
            name: "main".into(),
            init: false,
            devices: vec![device],
        }],
    };
    allocation.validate()?;
    let mut pod = pod_object(&format!("placed-{j}"), "placed", memory_mib, cores, mode);
    pod["spec"]["nodeName"] = json!(node_name(node));
    let meta = &mut pod["metadata"]["annotations"];
    meta[annotations::ALLOCATION] = json!(allocation.to_annotation());
    meta[annotations::BIND_PHASE] = json!("success");
    meta[annotations::BIND_TIME] = json!("2026-01-01T00:00:00Z");
    Ok(serde_json::from_value(pod)?)
}

/// A pending pod for a bind run: even `i` asks for 4000 MiB and 10 % of a
/// shared GPU, odd `i` for a MIG instance of 4000 MiB.
fn pending_pod(role: &str, i: usize) -> Result<Pod> {
    let name = format!("{role}-{i}");
    let pod = if i.is_multiple_of(2) {
        pod_object(&name, role, 4000, 10, "share")
    } else {
        pod_object(&name, role, 4000, 0, "mig")
    };
    Ok(serde_json::from_value(pod)?)
}

/// Whether the extender reserved for bind pod `i` what it asked for: the
/// share slice as asked, or the smallest allowlisted MIG profile of at least
/// 4000 MiB on A100-40GB, 1g.5gb (4864 MiB; mig.md), on a MIG GPU (6 or 7).
fn reserved_as_asked(i: usize, node: usize, allocation: &Allocation) -> Result<(), String> {
    let devices: Vec<&DeviceAllocation> = allocation
        .containers
        .iter()
        .flat_map(|c| c.devices.iter())
        .collect();
    let mig_gpus = [gpu_uuid(node, 6), gpu_uuid(node, 7)];
    match devices.as_slice() {
        [
            DeviceAllocation::Share {
                uuid,
                memory_mib: 4000,
                cores: 10,
            },
        ] if i.is_multiple_of(2) && !mig_gpus.contains(uuid) => Ok(()),
        [DeviceAllocation::Mig { uuid, profile, .. }]
            if !i.is_multiple_of(2) && profile == "1g.5gb" && mig_gpus.contains(uuid) =>
        {
            Ok(())
        }
        other => Err(format!("reserved {other:?}")),
    }
}

async fn create_all<K, F>(api: &Api<K>, count: usize, make: F) -> Result<Duration>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
    F: Fn(usize) -> Result<K>,
{
    let start = Instant::now();
    let objects = (0..count).map(make).collect::<Result<Vec<_>>>()?;
    futures::stream::iter(objects)
        .map(|object| async move {
            api.create(&PostParams::default(), &object)
                .await
                .map(|_| ())
                .context("creating an object")
        })
        .buffer_unordered(POPULATE_WORKERS)
        .try_collect::<()>()
        .await?;
    Ok(start.elapsed())
}

async fn populate(args: PopulateArgs) -> Result<()> {
    let Scale {
        nodes,
        pods,
        bind_pods,
    } = args.scale;
    ensure!(nodes > 0, "--nodes must be at least 1");
    ensure!(
        pods <= PLACED_PER_NODE * nodes,
        "--pods {pods}: the layout places at most {PLACED_PER_NODE} pods per node"
    );
    let client = client(&args.kubeconfig).await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))?;
    namespaces
        .create(&PostParams::default(), &namespace)
        .await
        .with_context(|| format!("creating namespace {NAMESPACE}"))?;
    let took_nodes = create_all(&Api::<Node>::all(client.clone()), nodes, node_object).await?;
    let pod_api: Api<Pod> = Api::namespaced(client, NAMESPACE);
    let took_pods = create_all(&pod_api, pods, |j| placed_pod(j, nodes)).await?;
    let took_pending = create_all(&pod_api, 2 * bind_pods, |i| {
        if i < bind_pods {
            pending_pod("bind", i)
        } else {
            pending_pod("base", i - bind_pods)
        }
    })
    .await?;
    eprintln!(
        "populate: {nodes} nodes in {:.1} s, {pods} placed pods in {:.1} s, {} pending pods in {:.1} s",
        took_nodes.as_secs_f64(),
        took_pods.as_secs_f64(),
        2 * bind_pods,
        took_pending.as_secs_f64()
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// The baseline extender.

struct Baseline {
    client: kube::Client,
}

/// The node names of an ExtenderArgs (nodeCacheCapable).
fn node_names(args: &Value) -> Vec<Value> {
    args["NodeNames"].as_array().cloned().unwrap_or_default()
}

async fn baseline_filter(body: Bytes) -> Json<Value> {
    let args: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    Json(json!({"NodeNames": node_names(&args), "FailedNodes": {}, "Error": ""}))
}

async fn baseline_prioritize(body: Bytes) -> Json<Value> {
    let args: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let scores: Vec<Value> = node_names(&args)
        .into_iter()
        .map(|host| json!({"Host": host, "Score": 0}))
        .collect();
    Json(Value::Array(scores))
}

async fn baseline_bind(State(ctx): State<Arc<Baseline>>, body: Bytes) -> Json<Value> {
    let args: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let text = |k: &str| args[k].as_str().unwrap_or_default().to_owned();
    let (name, namespace) = (text("PodName"), text("PodNamespace"));
    let binding = Binding {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(namespace.clone()),
            uid: Some(text("PodUID")).filter(|u| !u.is_empty()),
            ..Default::default()
        },
        target: ObjectReference {
            kind: Some("Node".into()),
            name: Some(text("Node")),
            ..Default::default()
        },
    };
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let error = match api
        .create_subresource::<Binding, Value>("binding", &name, &PostParams::default(), &binding)
        .await
    {
        Ok(_) => String::new(),
        Err(e) => e.to_string(),
    };
    Json(json!({"Error": error}))
}

async fn serve_baseline(args: BaselineArgs) -> Result<()> {
    let ctx = Arc::new(Baseline {
        client: client(&args.kubeconfig).await?,
    });
    let app = axum::Router::new()
        .route("/filter", post(baseline_filter))
        .route("/prioritize", post(baseline_prioritize))
        .route("/bind", post(baseline_bind))
        .with_state(ctx);
    let listener = tokio::net::TcpListener::bind(&args.listen).await?;
    let tmp = args.address_out.with_extension("tmp");
    std::fs::write(&tmp, listener.local_addr()?.to_string())?;
    std::fs::rename(&tmp, &args.address_out)?;
    axum::serve(listener, app).await?;
    Ok(())
}

// ---------------------------------------------------------------------------
// A minimal HTTP/1.1 keep-alive client: what kube-scheduler's Go client does
// per extender call, with no client library's own cost in the figures.

struct Conn {
    stream: TcpStream,
    authority: String,
    buf: Vec<u8>,
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

impl Conn {
    async fn open(url: &str) -> Result<Conn> {
        let authority = url
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned();
        let stream = TcpStream::connect(&authority)
            .await
            .with_context(|| format!("connecting to {authority}"))?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream,
            authority,
            buf: Vec::new(),
        })
    }

    async fn write_all(&mut self, mut data: &[u8]) -> Result<()> {
        while !data.is_empty() {
            self.stream.writable().await?;
            match self.stream.try_write(data) {
                Ok(n) => data = &data[n..],
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Reads more bytes into the buffer; an error at end of stream.
    async fn fill(&mut self) -> Result<()> {
        let mut chunk = [0u8; 64 * 1024];
        loop {
            self.stream.readable().await?;
            match self.stream.try_read(&mut chunk) {
                Ok(0) => bail!("{}: connection closed mid-answer", self.authority),
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    return Ok(());
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Reads up to `delimiter`: the text before it; both leave the buffer.
    async fn read_until(&mut self, delimiter: &[u8]) -> Result<String> {
        let end = loop {
            if let Some(at) = find(&self.buf, delimiter) {
                break at;
            }
            self.fill().await?;
        };
        let text = String::from_utf8_lossy(&self.buf[..end]).into_owned();
        self.buf.drain(..end + delimiter.len());
        Ok(text)
    }

    /// POSTs `body` to `path`; the status and answer body.
    async fn post(&mut self, path: &str, body: &[u8]) -> Result<(u16, Vec<u8>)> {
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nAccept: application/json\r\nContent-Length: {}\r\n\r\n",
            self.authority,
            body.len()
        );
        self.write_all(head.as_bytes()).await?;
        self.write_all(body).await?;
        let head = self.read_until(b"\r\n\r\n").await?;
        let mut lines = head.lines();
        let status: u16 = lines
            .next()
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("{path}: no status line in {head:?}"))?;
        let (mut length, mut chunked) = (None, false);
        for line in lines {
            if let Some((key, value)) = line.split_once(':') {
                match key.trim().to_ascii_lowercase().as_str() {
                    "content-length" => length = Some(value.trim().parse::<usize>()?),
                    "transfer-encoding" => chunked = value.to_ascii_lowercase().contains("chunked"),
                    _ => {}
                }
            }
        }
        let answer = if chunked {
            self.read_chunked().await?
        } else {
            let length = length.with_context(|| format!("{path}: no Content-Length"))?;
            while self.buf.len() < length {
                self.fill().await?;
            }
            self.buf.drain(..length).collect()
        };
        Ok((status, answer))
    }

    async fn read_chunked(&mut self) -> Result<Vec<u8>> {
        let mut answer = Vec::new();
        loop {
            let size_text = self.read_until(b"\r\n").await?;
            let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
                .with_context(|| format!("bad chunk size {size_text:?}"))?;
            while self.buf.len() < size + 2 {
                self.fill().await?;
            }
            answer.extend(self.buf.drain(..size));
            self.buf.drain(..2);
            if size == 0 {
                return Ok(answer);
            }
        }
    }

    async fn get_status(&mut self, path: &str) -> Result<u16> {
        let head = format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: 0\r\n\r\n",
            self.authority
        );
        self.write_all(head.as_bytes()).await?;
        let head = self.read_until(b"\r\n\r\n").await?;
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let length = head
            .lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.trim().parse::<usize>().ok());
        if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            self.read_chunked().await?;
        } else if let Some(length) = length {
            while self.buf.len() < length {
                self.fill().await?;
            }
            self.buf.drain(..length);
        }
        Ok(status)
    }
}

// ---------------------------------------------------------------------------
// Measuring.

/// Nearest-rank percentile of sorted durations.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

/// The pods filter and prioritize are asked about, in turn: a share slice,
/// a MIG instance (8000 MiB: 2g.10gb on A100-40GB) and the unified pool.
fn asking_pods() -> Vec<Value> {
    let shapes = [
        ("share", Some("share")),
        ("mig", Some("mig")),
        ("any", None),
    ];
    shapes
        .iter()
        .enumerate()
        .map(|(i, (name, mode))| {
            let mut pod = pod_object(&format!("ask-{name}"), "ask", 8000, 30, "");
            pod["metadata"]["uid"] = json!(format!("00000000-0000-4000-8000-{i:012}"));
            match mode {
                Some(mode) => pod["metadata"]["annotations"][annotations::VGPU_MODE] = json!(mode),
                None => pod["metadata"]["annotations"] = json!({}),
            }
            pod["spec"]["schedulerName"] = json!("tessera-scheduler");
            pod["status"] = json!({"phase": "Pending"});
            pod
        })
        .collect()
}

/// What one verb's run found.
struct Latency {
    sorted: Vec<Duration>,
    /// The first wrong answer, if any.
    problem: Option<String>,
}

/// Sends `requests` (+ warm-up) POSTs to `url/verb`, one at a time, and
/// checks each answer with `check`.
async fn run_verb(
    url: &str,
    verb: &str,
    bodies: &[Vec<u8>],
    requests: usize,
    check: impl Fn(&Value) -> Result<()>,
) -> Result<Latency> {
    let mut conn = Conn::open(url).await?;
    let path = format!("/{verb}");
    let mut times = Vec::with_capacity(requests);
    let mut problem = None;
    for i in 0..WARMUP + requests {
        let body = &bodies[i % bodies.len()];
        let start = Instant::now();
        let (status, answer) = conn.post(&path, body).await?;
        let took = start.elapsed();
        if i >= WARMUP {
            times.push(took);
        }
        if problem.is_none() {
            let outcome = if status == 200 {
                serde_json::from_slice::<Value>(&answer)
                    .context("answer is not JSON")
                    .and_then(|v| check(&v))
            } else {
                Err(anyhow::anyhow!(
                    "HTTP {status}: {}",
                    String::from_utf8_lossy(&answer)
                ))
            };
            if let Err(e) = outcome {
                problem = Some(format!("{url}{path} request {i}: {e:#}"));
            }
        }
    }
    times.sort();
    Ok(Latency {
        sorted: times,
        problem,
    })
}

/// A filter answer must pass every node: each has free share GPUs and room
/// for a 2g.10gb on GPU 7 (1g.5gb at slot 0 leaves 2-3, 4-5) and GPU 6
/// (3g.20gb at 0-3 leaves 4-5) — worked out by hand from the layout.
fn check_filter(answer: &Value, nodes: usize) -> Result<()> {
    ensure!(
        answer["Error"].as_str().unwrap_or_default().is_empty(),
        "Error: {}",
        answer["Error"]
    );
    let passed = answer["NodeNames"]
        .as_array()
        .context("no NodeNames in the answer")?;
    if passed.len() != nodes {
        let failed = answer["FailedNodes"].as_object();
        let first = failed.and_then(|f| f.iter().next());
        bail!(
            "{} of {nodes} nodes passed; first failed: {first:?}",
            passed.len()
        );
    }
    Ok(())
}

fn check_prioritize(answer: &Value, nodes: usize) -> Result<()> {
    let scores = answer.as_array().context("answer is not a list")?;
    ensure!(
        scores.len() == nodes,
        "{} scores for {nodes} nodes",
        scores.len()
    );
    for score in scores {
        let value = score["Score"].as_i64().context("a score without Score")?;
        ensure!((0..=10).contains(&value), "score {value} outside 0..=10");
        ensure!(score["Host"].is_string(), "a score without Host");
    }
    Ok(())
}

/// What one bind run found.
struct BindRun {
    took: Duration,
    sorted: Vec<Duration>,
    errors: Vec<String>,
}

/// Binds every pod of `pods` (name, uid) to node `i % nodes` through
/// `url/bind`, `concurrency` at a time.
async fn run_binds(
    url: &str,
    pods: &[(String, String)],
    nodes: usize,
    concurrency: usize,
) -> Result<BindRun> {
    let pods = Arc::new(pods.to_vec());
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency.max(1).min(pods.len().max(1)) {
        let mut conn = Conn::open(url).await?;
        let (pods, next) = (pods.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut times = Vec::new();
            let mut errors = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((name, uid)) = pods.get(i) else {
                    return anyhow::Ok((times, errors));
                };
                let body = serde_json::to_vec(&json!({
                    "PodName": name, "PodNamespace": NAMESPACE, "PodUID": uid,
                    "Node": node_name(i % nodes),
                }))?;
                let begun = Instant::now();
                let (status, answer) = conn.post("/bind", &body).await?;
                times.push(begun.elapsed());
                let error = if status == 200 {
                    serde_json::from_slice::<Value>(&answer)
                        .map(|v| v["Error"].as_str().unwrap_or_default().to_owned())
                        .unwrap_or_else(|e| format!("answer is not JSON: {e}"))
                } else {
                    format!("HTTP {status}: {}", String::from_utf8_lossy(&answer))
                };
                if !error.is_empty() {
                    errors.push(format!("{name}: {error}"));
                }
            }
        }));
    }
    let mut run = BindRun {
        took: Duration::ZERO,
        sorted: Vec::new(),
        errors: Vec::new(),
    };
    for task in tasks {
        let (times, errors) = task.await??;
        run.sorted.extend(times);
        run.errors.extend(errors);
    }
    run.took = start.elapsed();
    run.sorted.sort();
    Ok(run)
}

/// The device plugin's part, standing in: every pod of the bind run the
/// extender leaves `allocating` is set to `success`, as Allocate would.
fn spawn_device_plugin_loop(client: kube::Client) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let api: Api<Pod> = Api::namespaced(client, NAMESPACE);
        let config = watcher::Config::default().labels(&format!("{ROLE_LABEL}=bind"));
        let api_for_patch = api.clone();
        let stream = watcher::watcher(api, config).filter_map(|event| async move {
            match event {
                Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => Some(pod),
                _ => None,
            }
        });
        stream
            .for_each_concurrent(16, |pod| {
                let api = api_for_patch.clone();
                async move {
                    // A pod seen twice allocating is patched twice: the
                    // second write changes nothing.
                    let allocating = pod
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(annotations::BIND_PHASE))
                        .is_some_and(|p| p == "allocating");
                    let Some(name) = pod.metadata.name.clone().filter(|_| allocating) else {
                        return;
                    };
                    let patch =
                        json!({"metadata": {"annotations": {annotations::BIND_PHASE: "success"}}});
                    if let Err(e) = api
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                    {
                        eprintln!("device-plugin loop: {name}: {e}");
                    }
                }
            })
            .await;
    })
}

/// Pods of `role`, by index (name `role-i`): (name, uid).
async fn pods_of(api: &Api<Pod>, role: &str, count: usize) -> Result<Vec<(String, String)>> {
    let list = api
        .list(&ListParams::default().labels(&format!("{ROLE_LABEL}={role}")))
        .await?;
    let by_name: BTreeMap<String, String> = list
        .items
        .into_iter()
        .filter_map(|p| Some((p.metadata.name?, p.metadata.uid?)))
        .collect();
    (0..count)
        .map(|i| {
            let name = format!("{role}-{i}");
            let uid = by_name
                .get(&name)
                .with_context(|| format!("pod {name} is missing; run populate first"))?;
            Ok((name, uid.clone()))
        })
        .collect()
}

/// Checks in the API that every bound pod is on its node, and, for the
/// extender's run, carries a parseable allocation for that node.
async fn check_bound(
    api: &Api<Pod>,
    role: &str,
    nodes: usize,
    allocation: bool,
) -> Result<Vec<String>> {
    let list = api
        .list(&ListParams::default().labels(&format!("{ROLE_LABEL}={role}")))
        .await?;
    let mut problems = Vec::new();
    for pod in list.items {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let Some(i) = name
            .strip_prefix(&format!("{role}-"))
            .and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        let want = node_name(i % nodes);
        let on = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        if on.as_deref() != Some(want.as_str()) {
            problems.push(format!("{name}: on {on:?}, not {want}"));
            continue;
        }
        if allocation {
            let text = pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(annotations::ALLOCATION));
            match text.map(|t| Allocation::parse(t)) {
                Some(Ok(a)) if a.node == want => {
                    if let Err(e) = reserved_as_asked(i, i % nodes, &a) {
                        problems.push(format!("{name}: {e}"));
                    }
                }
                Some(Ok(a)) => problems.push(format!("{name}: allocation for {}", a.node)),
                Some(Err(e)) => problems.push(format!("{name}: {e}")),
                None => problems.push(format!("{name}: no {}", annotations::ALLOCATION)),
            }
        }
    }
    Ok(problems)
}

async fn wait_ready(url: &str) -> Result<Duration> {
    let start = Instant::now();
    loop {
        if let Ok(mut conn) = Conn::open(url).await
            && let Ok(200) = conn.get_status("/readyz").await
        {
            return Ok(start.elapsed());
        }
        if start.elapsed() > READY_TIMEOUT {
            bail!("{url}/readyz did not answer 200 in {READY_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One row of the table.
struct Row {
    what: String,
    n: usize,
    figure: String,
    goal: String,
}

async fn measure(args: MeasureArgs) -> Result<()> {
    let Scale {
        nodes, bind_pods, ..
    } = args.scale;
    let mut missing: Vec<String> = Vec::new();
    let mut rows: Vec<Row> = Vec::new();
    let ready = wait_ready(&args.extender).await?;
    eprintln!(
        "measure: extender ready after {:.2} s of waiting",
        ready.as_secs_f64()
    );

    let names: Vec<String> = (0..nodes).map(node_name).collect();
    let bodies: Vec<Vec<u8>> = asking_pods()
        .into_iter()
        .map(|pod| serde_json::to_vec(&json!({"Pod": pod, "Nodes": null, "NodeNames": names})))
        .collect::<Result<_, _>>()?;
    let request_bytes = bodies.iter().map(Vec::len).max().unwrap_or(0);
    for verb in ["filter", "prioritize"] {
        for (who, url) in [("tessera", &args.extender), ("baseline", &args.baseline)] {
            let run = match verb {
                "filter" => {
                    run_verb(url, verb, &bodies, args.requests, |a| {
                        check_filter(a, nodes)
                    })
                    .await?
                }
                _ => {
                    run_verb(url, verb, &bodies, args.requests, |a| {
                        check_prioritize(a, nodes)
                    })
                    .await?
                }
            };
            if let Some(problem) = run.problem {
                missing.push(format!("{verb} {who}: {problem}"));
            }
            let (p50, p99) = (percentile(&run.sorted, 50.0), percentile(&run.sorted, 99.0));
            let goal = if who == "tessera" {
                let met = p99 <= Duration::from_millis(5);
                format!("p99 ≤ 5 ms: {}", if met { "met" } else { "NOT met" })
            } else {
                String::new()
            };
            rows.push(Row {
                what: format!("{verb} {who}"),
                n: run.sorted.len(),
                figure: format!("p50 {}  p99 {}", ms(p50), ms(p99)),
                goal,
            });
        }
    }

    let client = client(&args.kubeconfig).await?;
    let api: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let plugin = spawn_device_plugin_loop(client.clone());
    for (who, role, url) in [
        ("tessera", "bind", &args.extender),
        ("baseline", "base", &args.baseline),
    ] {
        let pods = pods_of(&api, role, bind_pods).await?;
        let run = run_binds(url, &pods, nodes, args.concurrency).await?;
        let rate = run.sorted.len() as f64 / run.took.as_secs_f64().max(1e-9);
        for e in run.errors.iter().take(3) {
            eprintln!("bind {who}: {e}");
        }
        if !run.errors.is_empty() {
            missing.push(format!(
                "bind {who}: {} of {} binds failed",
                run.errors.len(),
                pods.len()
            ));
        }
        let problems = check_bound(&api, role, nodes, who == "tessera").await?;
        for p in problems.iter().take(3) {
            eprintln!("bind {who}: {p}");
        }
        if !problems.is_empty() {
            missing.push(format!(
                "bind {who}: {} pods not bound as asked",
                problems.len()
            ));
        }
        let goal = if who == "tessera" {
            format!(
                "≥ 500 pods/s: {}",
                if rate >= 500.0 { "met" } else { "NOT met" }
            )
        } else {
            String::new()
        };
        rows.push(Row {
            what: format!("bind {who} ×{}", args.concurrency),
            n: run.sorted.len(),
            figure: format!(
                "{rate:.0} pods/s  p50 {}  p99 {}",
                ms(percentile(&run.sorted, 50.0)),
                ms(percentile(&run.sorted, 99.0))
            ),
            goal,
        });
    }
    plugin.abort();

    println!(
        "{nodes} nodes × {GPUS_PER_NODE} GPUs, {} pods placed; filter/prioritize: {} names per request ({} KiB), {} sequential requests after {WARMUP} warm-up; bind: {bind_pods} pods, {} at once",
        args.scale.pods,
        nodes,
        request_bytes / 1024,
        args.requests,
        args.concurrency
    );
    println!("{:<24} {:>6}  {:<44} goal", "measurement", "n", "figure");
    for row in &rows {
        println!(
            "{:<24} {:>6}  {:<44} {}",
            row.what, row.n, row.figure, row.goal
        );
    }
    if !missing.is_empty() {
        for m in &missing {
            eprintln!("bench-extender: {m}");
        }
        bail!("{} figure(s) missing or wrong", missing.len());
    }
    Ok(())
}
