//! Scale benchmark of the stand-in API server (run by
//! `scripts/bench-apiserver.sh`, which starts the server): loads nodes and
//! pods concurrently, then measures list, selected and paged lists, watch
//! event latency with 1 and 100 watchers, create throughput and the server's
//! memory, side by side with baselines (`/version`, a list of 100 pods).
//!
//! ```text
//! apiserver-load --server http://127.0.0.1:PORT --pid PID [--nodes 1000] [--pods 10000] [--runs 20]
//! ```
//!
//! Plain HTTP/1.1 over keep-alive connections (hyper), so the figures are the
//! server's and the transport's, not a client library's decoding.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// Command-line options.
struct Options {
    server: String,
    pid: Option<u32>,
    nodes: usize,
    pods: usize,
    runs: usize,
    workers: usize,
}

fn options() -> Result<Options> {
    let mut o = Options {
        server: String::new(),
        pid: None,
        nodes: 1000,
        pods: 10_000,
        runs: 20,
        workers: 16,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--server" => o.server = value()?,
            "--pid" => o.pid = Some(value()?.parse().context("--pid")?),
            "--nodes" => o.nodes = value()?.parse().context("--nodes")?,
            "--pods" => o.pods = value()?.parse().context("--pods")?,
            "--runs" => o.runs = value()?.parse().context("--runs")?,
            "--workers" => o.workers = value()?.parse().context("--workers")?,
            other => bail!("unknown argument {other}"),
        }
    }
    if o.server.is_empty() {
        bail!("--server http://HOST:PORT is required");
    }
    Ok(o)
}

/// One keep-alive HTTP/1.1 connection.
struct Conn {
    send: SendRequest<Full<Bytes>>,
    authority: String,
}

impl Conn {
    async fn open(server: &str) -> Result<Conn> {
        let authority = server
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned();
        let stream = TcpStream::connect(&authority)
            .await
            .with_context(|| format!("connecting to {authority}"))?;
        stream.set_nodelay(true)?;
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Conn { send, authority })
    }

    fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<hyper::Request<Full<Bytes>>> {
        let body = match body {
            Some(v) => Bytes::from(serde_json::to_vec(v)?),
            None => Bytes::new(),
        };
        Ok(hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", &self.authority)
            .header("accept", "application/json")
            .header("content-type", "application/json")
            .body(Full::new(body))?)
    }

    /// Sends a request and reads the whole answer: status, body, time taken.
    async fn call(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Bytes, Duration)> {
        let request = self.request(method, path, body)?;
        let start = Instant::now();
        self.send.ready().await?;
        let response = self.send.send_request(request).await?;
        let status = response.status().as_u16();
        let bytes = response.into_body().collect().await?.to_bytes();
        Ok((status, bytes, start.elapsed()))
    }

    /// [`Self::call`], failing unless the status is 2xx.
    async fn ok(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(Bytes, Duration)> {
        let (status, bytes, took) = self.call(method, path, body).await?;
        if !(200..300).contains(&status) {
            bail!(
                "{method} {path}: {status}: {}",
                String::from_utf8_lossy(&bytes)
            );
        }
        Ok((bytes, took))
    }
}

fn pod(name: &str, node: &str, app: &str) -> Value {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {"containers": [{"name": "main", "image": "busybox",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    });
    if !node.is_empty() {
        pod["spec"]["nodeName"] = json!(node);
    }
    pod
}

fn node(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}})
}

async fn create_namespace(conn: &mut Conn, name: &str) -> Result<()> {
    let (status, body, _) = conn
        .call(
            "POST",
            "/api/v1/namespaces",
            Some(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})),
        )
        .await?;
    if status != 201 && status != 200 && status != 409 {
        bail!(
            "creating namespace {name}: {status}: {}",
            String::from_utf8_lossy(&body)
        );
    }
    Ok(())
}

/// Creates `count` objects with `workers` connections at once; the time it took.
async fn create_many(
    server: &str,
    workers: usize,
    count: usize,
    make: impl Fn(usize) -> (String, Value) + Send + Sync + 'static,
) -> Result<Duration> {
    let next = Arc::new(AtomicUsize::new(0));
    let make = Arc::new(make);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..workers.min(count.max(1)) {
        let mut conn = Conn::open(server).await?;
        let next = next.clone();
        let make = make.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return anyhow::Ok(());
                }
                let (path, body) = make(i);
                conn.ok("POST", &path, Some(&body)).await?;
            }
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(start.elapsed())
}

/// Latency figures of one measurement, in milliseconds.
struct Figures {
    name: String,
    samples: Vec<f64>,
    bytes: Option<usize>,
}

impl Figures {
    fn percentile(&self, p: f64) -> f64 {
        let mut s = self.samples.clone();
        s.sort_by(f64::total_cmp);
        if s.is_empty() {
            return f64::NAN;
        }
        let rank = ((p * s.len() as f64).ceil() as usize).clamp(1, s.len());
        s[rank - 1]
    }

    fn row(&self) -> String {
        format!(
            "| {} | {} | {:.2} | {:.2} | {} |",
            self.name,
            self.samples.len(),
            self.percentile(0.5),
            self.percentile(0.95),
            self.bytes.map_or("".to_owned(), |b| b.to_string())
        )
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// `runs` GETs of `path`: latency and response size.
async fn measure_get(
    conn: &mut Conn,
    name: &str,
    path: &str,
    runs: usize,
    expect_items: Option<usize>,
) -> Result<Figures> {
    let mut samples = Vec::with_capacity(runs);
    let mut bytes = 0;
    for _ in 0..runs {
        let (body, took) = conn.ok("GET", path, None).await?;
        samples.push(ms(took));
        bytes = body.len();
        if let Some(want) = expect_items {
            let v: Value = serde_json::from_slice(&body)?;
            let got = v["items"].as_array().map_or(0, Vec::len);
            if got != want {
                bail!("{path}: {got} items, expected {want}");
            }
        }
    }
    Ok(Figures {
        name: name.to_owned(),
        samples,
        bytes: Some(bytes),
    })
}

/// Walks a paged list (`limit`) to its end, `runs` times: time per page and
/// for the whole walk (the sum of its requests, without the client's
/// decoding in between); checks that every item came exactly once.
async fn measure_paged(
    conn: &mut Conn,
    runs: usize,
    limit: usize,
    total: usize,
) -> Result<(Figures, Figures)> {
    let mut per_page = Vec::new();
    let mut walks = Vec::new();
    for _ in 0..runs {
        let mut walk = 0.0;
        let mut cont = String::new();
        let mut seen = 0usize;
        let mut names = std::collections::HashSet::new();
        loop {
            let mut path = format!("/api/v1/pods?limit={limit}");
            if !cont.is_empty() {
                path.push_str(&format!("&continue={cont}"));
            }
            let (body, took) = conn.ok("GET", &path, None).await?;
            per_page.push(ms(took));
            walk += ms(took);
            let v: Value = serde_json::from_slice(&body)?;
            for item in v["items"].as_array().map_or(&[][..], Vec::as_slice) {
                let key = format!(
                    "{}/{}",
                    item["metadata"]["namespace"], item["metadata"]["name"]
                );
                names.insert(key);
                seen += 1;
            }
            cont = v["metadata"]["continue"].as_str().unwrap_or("").to_owned();
            if cont.is_empty() {
                break;
            }
            // A continue token is opaque; pass it on URL-safe.
            cont = cont
                .replace('+', "%2B")
                .replace('/', "%2F")
                .replace('=', "%3D");
        }
        walks.push(walk);
        if seen != total || names.len() != total {
            bail!(
                "paged list: {seen} items ({} distinct), expected {total}",
                names.len()
            );
        }
    }
    Ok((
        Figures {
            name: format!("paged list, one page (limit={limit})"),
            samples: per_page,
            bytes: None,
        },
        Figures {
            name: format!("paged list, whole walk ({total} pods, limit={limit})"),
            samples: walks,
            bytes: None,
        },
    ))
}

/// Watch latency: `watchers` watches of all pods from the current
/// resourceVersion; `writes` pods created one after another; for each, the
/// time from the create's response to the ADDED event at each watcher.
async fn measure_watch(
    server: &str,
    watchers: usize,
    writes: usize,
    round: &str,
) -> Result<Figures> {
    let mut conn = Conn::open(server).await?;
    let (body, _) = conn
        .ok("GET", "/api/v1/namespaces/watch/pods?limit=1", None)
        .await?;
    let v: Value = serde_json::from_slice(&body)?;
    let rv = v["metadata"]["resourceVersion"]
        .as_str()
        .context("list resourceVersion")?
        .to_owned();
    let (tx, mut rx) = mpsc::unbounded_channel::<(String, Instant)>();
    let mut ready = Vec::new();
    for _ in 0..watchers {
        let mut watch = Conn::open(server).await?;
        let tx = tx.clone();
        let path = format!("/api/v1/pods?watch=true&resourceVersion={rv}");
        let request = watch.request("GET", &path, None)?;
        watch.send.ready().await?;
        let response = watch.send.send_request(request).await?;
        if !response.status().is_success() {
            bail!("watch: {}", response.status());
        }
        ready.push(tokio::spawn(async move {
            let _keep = watch;
            let mut body = response.into_body();
            let mut buf: Vec<u8> = Vec::new();
            while let Some(frame) = body.frame().await {
                let Ok(frame) = frame else { break };
                let Some(data) = frame.data_ref() else {
                    continue;
                };
                let now = Instant::now();
                buf.extend_from_slice(data);
                while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=pos).collect();
                    let Ok(event) = serde_json::from_slice::<Value>(&line) else {
                        continue;
                    };
                    if event["type"] == "ADDED" {
                        let name = event["object"]["metadata"]["name"]
                            .as_str()
                            .unwrap_or("")
                            .to_owned();
                        if tx.send((name, now)).is_err() {
                            return;
                        }
                    }
                }
            }
        }));
    }
    drop(tx);
    // Let every watch reach the server's watch loop before writing.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut samples = Vec::new();
    let mut early: HashMap<String, Vec<Instant>> = HashMap::new();
    for i in 0..writes {
        let name = format!("w-{round}-{i}");
        let (_, _) = conn
            .ok(
                "POST",
                "/api/v1/namespaces/watch/pods",
                Some(&pod(&name, "", "watch")),
            )
            .await?;
        let responded = Instant::now();
        let mut arrivals = early.remove(&name).unwrap_or_default();
        let deadline = responded + Duration::from_secs(30);
        while arrivals.len() < watchers {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, rx.recv()).await {
                Ok(Some((got, at))) if got == name => arrivals.push(at),
                Ok(Some((got, at))) => early.entry(got).or_default().push(at),
                Ok(None) => bail!("watch streams ended"),
                Err(_) => bail!(
                    "{name}: {} of {watchers} watchers saw it in 30 s",
                    arrivals.len()
                ),
            }
        }
        // Signed: an event may reach a watcher before the writer reads its response.
        samples.extend(arrivals.iter().map(|at| {
            if *at >= responded {
                ms(*at - responded)
            } else {
                -ms(responded - *at)
            }
        }));
    }
    for task in ready {
        task.abort();
    }
    Ok(Figures {
        name: format!("watch event latency, {watchers} watcher(s) × {writes} writes"),
        samples,
        bytes: None,
    })
}

/// VmRSS and VmHWM of a process, in MiB.
fn memory(pid: u32) -> Result<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |key: &str| -> Result<f64> {
        let line = status
            .lines()
            .find(|l| l.starts_with(key))
            .with_context(|| format!("{key} in /proc/{pid}/status"))?;
        let kib: f64 = line.split_whitespace().nth(1).context("value")?.parse()?;
        Ok(kib / 1024.0)
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let o = options()?;
    let runs = o.runs;
    let mut conn = Conn::open(&o.server).await?;
    let mut table: Vec<Figures> = Vec::new();
    if let Some(pid) = o.pid {
        let (rss, _) = memory(pid)?;
        println!("server RSS at start: {rss:.1} MiB");
    }

    for ns in ["small", "bench", "watch"] {
        create_namespace(&mut conn, ns).await?;
    }
    let server = o.server.clone();
    create_many(&server, o.workers, 100, |i| {
        (
            "/api/v1/namespaces/small/pods".to_owned(),
            pod(&format!("small-{i}"), "base-node", "small"),
        )
    })
    .await?;

    // Baselines with 100 pods in the server.
    let mut f = measure_get(&mut conn, "baseline: GET /version", "/version", runs, None).await?;
    f.name = "baseline: GET /version (100 pods stored)".into();
    table.push(f);
    table.push(
        measure_get(
            &mut conn,
            "baseline: list all pods (100 stored)",
            "/api/v1/pods",
            runs,
            Some(100),
        )
        .await?,
    );

    // Load: nodes, then pods spread over them, concurrently.
    let nodes = o.nodes;
    let took_nodes = create_many(&server, o.workers, nodes, |i| {
        ("/api/v1/nodes".to_owned(), node(&format!("node-{i:05}")))
    })
    .await?;
    let took_pods = create_many(&server, o.workers, o.pods, move |i| {
        let node = format!("node-{:05}", i % nodes.max(1));
        let app = format!("app-{}", i % 10);
        (
            "/api/v1/namespaces/bench/pods".to_owned(),
            pod(&format!("pod-{i:06}"), &node, &app),
        )
    })
    .await?;
    let node_rate = nodes as f64 / took_nodes.as_secs_f64();
    let pod_rate = o.pods as f64 / took_pods.as_secs_f64();
    let memory_loaded = o.pid.map(memory).transpose()?;

    let total = o.pods + 100;
    let per_node = o.pods / nodes.max(1);
    let mut f = measure_get(&mut conn, "", "/version", runs, None).await?;
    f.name = format!("GET /version ({total} pods stored)");
    table.push(f);
    table.push(
        measure_get(
            &mut conn,
            &format!("list all pods ({total})"),
            "/api/v1/pods",
            runs,
            Some(total),
        )
        .await?,
    );
    table.push(
        measure_get(
            &mut conn,
            "list pods of namespace small (100 of the stored)",
            "/api/v1/namespaces/small/pods",
            runs,
            Some(100),
        )
        .await?,
    );
    table.push(
        measure_get(
            &mut conn,
            &format!("list fieldSelector=spec.nodeName=node-00007 ({per_node} pods)"),
            "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-00007",
            runs,
            Some(per_node),
        )
        .await?,
    );
    table.push(
        measure_get(
            &mut conn,
            &format!("list labelSelector=app=app-3 ({} pods)", o.pods / 10),
            "/api/v1/namespaces/bench/pods?labelSelector=app%3Dapp-3",
            runs,
            Some(o.pods / 10),
        )
        .await?,
    );
    table.push(
        measure_get(
            &mut conn,
            &format!("list all nodes ({nodes})"),
            "/api/v1/nodes",
            runs,
            Some(nodes),
        )
        .await?,
    );
    let (page, walk) = measure_paged(&mut conn, runs.div_ceil(4).max(2), 500, total).await?;
    table.push(page);
    table.push(walk);
    let writes = runs.max(10);
    table.push(measure_watch(&server, 1, writes, "a").await?);
    table.push(measure_watch(&server, 100, writes, "b").await?);

    println!();
    println!("| measurement | samples | p50 (ms) | p95 (ms) | response bytes |");
    println!("|---|---:|---:|---:|---:|");
    for f in &table {
        println!("{}", f.row());
    }
    println!();
    println!(
        "create throughput ({} connections): {nodes} nodes in {:.2} s = {node_rate:.0}/s; {} pods in {:.2} s = {pod_rate:.0}/s",
        o.workers,
        took_nodes.as_secs_f64(),
        o.pods,
        took_pods.as_secs_f64()
    );
    if let (Some(pid), Some((rss, hwm))) = (o.pid, memory_loaded) {
        let (rss_end, hwm_end) = memory(pid)?;
        println!(
            "server memory after loading: VmRSS {rss:.1} MiB, VmHWM {hwm:.1} MiB; at the end: VmRSS {rss_end:.1} MiB, VmHWM {hwm_end:.1} MiB"
        );
    }
    Ok(())
}
