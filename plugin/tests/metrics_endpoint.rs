//! The node monitor's metrics endpoint over real HTTP: `hami_mig_device_info`
//! for a realized MIG instance of the checkpoint with HAMi's labels,
//! `/healthz`, a clean stop on shutdown, and a listen address that cannot be
//! bound → one line naming the flag.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tessera_driver::fake::{FakeDriver, FakeGpu};
use tessera_model::mig::Placement;
use tessera_plugin::checkpoint::{AllocRecord, InstanceRecord, Phase, Store};
use tessera_plugin::config::{CdiMode, PluginConfig};
use tessera_plugin::metrics;
use tessera_plugin::monitor::Monitor;
use tessera_plugin::run::NodeContext;
use tokio::sync::watch;

/// The test's configuration, node `node-a`, metrics on `listen`.
fn config(state_dir: &Path, listen: SocketAddr) -> PluginConfig {
    PluginConfig {
        node_name: "node-a".to_owned(),
        metrics_listen: Some(listen),
        ..common::config(Path::new("/"), state_dir, CdiMode::CdiField)
    }
}

/// A context with the fake driver and a client of an address nothing
/// serves (the metrics read only the checkpoint and the monitor).
fn context(state_dir: &Path, listen: SocketAddr) -> Result<Arc<NodeContext>> {
    let kube = kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse()?))?;
    Ok(Arc::new(NodeContext {
        config: config(state_dir, listen),
        driver: Arc::new(FakeDriver::new().with_gpu(FakeGpu::a100_40gb(0))),
        client: kube,
        checkpoint: Arc::new(Store::open(state_dir)?),
    }))
}

fn record() -> AllocRecord {
    AllocRecord {
        alloc_id: "0d5e-uid-1".to_owned(),
        pod_uid: "0d5e-uid".to_owned(),
        namespace: "team-a".to_owned(),
        pod: "mig-pod".to_owned(),
        container: "trainer".to_owned(),
        container_index: 1,
        phase: Phase::Ready,
        instances: vec![InstanceRecord {
            gpu_uuid: "GPU-a1000000-0000-4000-8000-000000000000".to_owned(),
            gpu_index: 0,
            profile_id: 9,
            profile: "3g.20gb".to_owned(),
            placement: Placement { start: 4, size: 4 },
            gpu_instance_id: Some(2),
            compute_instance_id: Some(0),
            mig_uuid: Some("MIG-5c3c2a6e-0000-5000-8000-000000000001".to_owned()),
        }],
        device_ids: vec!["GPU-a1000000-0000-4000-8000-000000000000::mig0".to_owned()],
        created_unix: 1,
    }
}

fn free_port() -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?)
}

/// `GET path` over a plain TCP connection: (status code, body).
fn get(address: SocketAddr, path: &str) -> Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply)?;
    let (head, body) = reply.split_once("\r\n\r\n").context("an HTTP reply")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .context("a status line")?
        .parse()?;
    // Chunked bodies: drop the chunk-size lines (the exposition's lines
    // never are bare hex numbers).
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body.lines()
            .filter(|l| u64::from_str_radix(l.trim(), 16).is_err())
            .collect::<Vec<_>>()
            .join("\n")
    } else {
        body.to_owned()
    };
    Ok((status, body))
}

/// One sample line `name{k="v",…} value` → its labels and value.
fn parse_sample(line: &str) -> Result<(BTreeMap<String, String>, f64)> {
    let (_, rest) = line.split_once('{').context("labels")?;
    let (labels, value) = rest.rsplit_once("} ").context("value")?;
    let mut map = BTreeMap::new();
    for pair in labels.split("\",") {
        let (k, v) = pair.split_once("=\"").context("k=\"v\"")?;
        map.insert(k.to_owned(), v.trim_end_matches('"').to_owned());
    }
    Ok((map, value.trim().parse()?))
}

async fn scrape_when_up(address: SocketAddr) -> Result<(u16, String)> {
    let start = Instant::now();
    loop {
        match tokio::task::spawn_blocking(move || get(address, "/metrics")).await? {
            Ok(reply) => return Ok(reply),
            Err(e) if start.elapsed() > Duration::from_secs(10) => {
                bail!("metrics endpoint not up within 10 s: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mig_instances_are_scraped_with_hami_labels() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let address = free_port()?;
    let ctx = context(dir.path(), address)?;
    ctx.checkpoint.update(|c| {
        let r = record();
        c.allocations.insert(r.alloc_id.clone(), r);
    })?;
    let monitor = Monitor::new(ctx.clone());
    let (stop_tx, stop_rx) = watch::channel(false);
    let server = tokio::spawn(metrics::serve(ctx.clone(), monitor, stop_rx));

    let (status, body) = scrape_when_up(address).await?;
    assert_eq!(status, 200, "{body}");
    let lines: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("hami_mig_device_info{"))
        .collect();
    assert_eq!(lines.len(), 1, "{body}");
    let (labels, value) = parse_sample(lines[0])?;
    assert_eq!(value, 1.0);
    let expected: BTreeMap<String, String> = [
        ("namespace", "team-a"),
        ("pod", "mig-pod"),
        ("container", "trainer"),
        ("vdevice_index", "0"),
        ("device_uuid", "GPU-a1000000-0000-4000-8000-000000000000"),
        ("mig_uuid", "MIG-5c3c2a6e-0000-5000-8000-000000000001"),
        ("profile", "3g.20gb"),
        ("gpu_instance_id", "2"),
        ("compute_instance_id", "0"),
        ("zone", "vGPU"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    assert_eq!(labels, expected);
    assert!(body.contains("# TYPE hami_mig_device_info gauge"), "{body}");
    assert!(body.contains("MigInfo{podnamespace=\"team-a\""), "{body}");
    // The whole GPU, read from the driver at scrape time.
    let host: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("hami_host_gpu_memory_used_bytes{"))
        .collect();
    assert_eq!(host.len(), 1, "{body}");
    let (labels, value) = parse_sample(host[0])?;
    assert_eq!(value, 0.0);
    assert_eq!(labels["node"], "node-a");
    assert_eq!(
        labels["device_uuid"],
        "GPU-a1000000-0000-4000-8000-000000000000"
    );
    assert!(
        body.contains("HostCoreUtilization{nodeid=\"node-a\",deviceidx=\"0\""),
        "{body}"
    );

    // Reclaim begins: the instance is no longer listed.
    ctx.checkpoint.update(|c| {
        if let Some(r) = c.allocations.get_mut("0d5e-uid-1") {
            r.phase = Phase::Reclaiming;
        }
    })?;
    let (_, body) = tokio::task::spawn_blocking(move || get(address, "/metrics")).await??;
    assert!(!body.contains("hami_mig_device_info{"), "{body}");

    let (status, body) = tokio::task::spawn_blocking(move || get(address, "/healthz")).await??;
    assert_eq!((status, body.trim()), (200, "ok"));

    stop_tx.send(true)?;
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .context("the endpoint stops on shutdown")???;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_that_cannot_be_bound_is_one_line_naming_the_flag() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let taken = TcpListener::bind("127.0.0.1:0")?;
    let address = taken.local_addr()?;
    let ctx = context(dir.path(), address)?;
    let monitor = Monitor::new(ctx.clone());
    let (_stop_tx, stop_rx) = watch::channel(false);
    let error = tokio::time::timeout(
        Duration::from_secs(5),
        metrics::serve(ctx, monitor, stop_rx),
    )
    .await
    .context("serve returns at once")?
    .expect_err("the port is taken")
    .to_string();
    assert!(
        error.starts_with(&format!("--metrics-listen {address}: ")),
        "{error}"
    );
    assert!(!error.contains('\n'), "{error}");
    Ok(())
}
