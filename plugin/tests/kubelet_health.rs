//! The kubelet side of the plugin in-process, over real unix sockets in a
//! temporary kubelet dir: test-support's `FakeKubelet` plays kubelet,
//! the driver is the scripted `FakeDriver` (an H100 shared, an A100 with
//! MIG). Registration, options, ListAndWatch, XIDs and lost GPUs reaching
//! ListAndWatch (latency measured), re-registration after a kubelet restart,
//! and a clean stop. Needs no root and no program.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use clap::Parser;
use tessera_driver::HealthEvent;
use tessera_driver::fake::{FakeDriver, FakeGpu};
use tessera_plugin::api::deviceplugin::v1beta1 as dp;
use tessera_plugin::checkpoint::Store;
use tessera_plugin::cli::{self, Args};
use tessera_plugin::health::Health;
use tessera_plugin::run::NodeContext;
use tessera_plugin::server;
use tessera_test_support::kubelet::FakeKubelet;
use tokio::sync::watch;

const H100: &str = "GPU-h1000000-0000-4000-8000-000000000000";
const A100: &str = "GPU-a1000001-0000-4000-8000-000000000000";

type Stream = tonic::Streaming<dp::ListAndWatchResponse>;

async fn list_and_watch(socket: &Path) -> Result<Stream> {
    let channel = server::unix_channel(socket).await?;
    Ok(dp::device_plugin_client::DevicePluginClient::new(channel)
        .list_and_watch(dp::Empty {})
        .await?
        .into_inner())
}

/// Reads lists until `want` holds for one (within `within`); returns it
/// and how long it took.
async fn wait_list(
    stream: &mut Stream,
    within: Duration,
    what: &str,
    want: impl Fn(&[dp::Device]) -> bool,
) -> Result<(Vec<dp::Device>, Duration)> {
    let start = Instant::now();
    loop {
        let left = within.saturating_sub(start.elapsed());
        let next = tokio::time::timeout(left, stream.message())
            .await
            .with_context(|| format!("no list where {what} within {within:?}"))??
            .context("ListAndWatch ended")?;
        if want(&next.devices) {
            return Ok((next.devices, start.elapsed()));
        }
    }
}

fn health_of<'a>(devices: &'a [dp::Device], uuid: &str) -> Vec<&'a str> {
    devices
        .iter()
        .filter(|d| d.id.starts_with(&format!("{uuid}::")))
        .map(|d| d.health.as_str())
        .collect()
}

fn all(devices: &[dp::Device], uuid: &str, health: &str) -> bool {
    let of = health_of(devices, uuid);
    !of.is_empty() && of.iter().all(|h| *h == health)
}

struct Plugin {
    driver: Arc<FakeDriver>,
    kubelet_dir: PathBuf,
    shutdown: watch::Sender<bool>,
    server: tokio::task::JoinHandle<Result<(), server::ServerError>>,
    health: tokio::task::JoinHandle<()>,
    _scratch: tempfile::TempDir,
}

async fn start_plugin(kubelet_dir: &Path) -> Result<Plugin> {
    let scratch = tempfile::tempdir()?;
    let driver = Arc::new(
        FakeDriver::new()
            .with_gpu(FakeGpu::plain(0, "NVIDIA H100 80GB HBM3", 81559).with_uuid(H100))
            .with_gpu(FakeGpu::a100_40gb(1).with_uuid(A100)),
    );
    let args = Args::try_parse_from([
        cli::PROGRAM,
        "--node-name",
        "node-h",
        "--device-split-count",
        "4",
        "--kubelet-dir",
        &kubelet_dir.display().to_string(),
        "--state-dir",
        &scratch.path().join("state").display().to_string(),
        "--metrics-listen",
        "off",
    ])?;
    let config = cli::resolve(&args, None, &Default::default())?;
    // Never dialed: the kubelet side does not talk to the API server.
    let client = kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse()?))?;
    let ctx = Arc::new(NodeContext {
        config,
        driver: driver.clone(),
        client,
        checkpoint: Arc::new(Store::open(&scratch.path().join("state"))?),
    });
    let (shutdown, shutdown_rx) = watch::channel(false);
    let health = Health::new(ctx.clone());
    let health_task = tokio::spawn(health.clone().run(shutdown_rx.clone()));
    let server_task = tokio::spawn(server::run(ctx, health.subscribe(), shutdown_rx));
    Ok(Plugin {
        driver,
        kubelet_dir: kubelet_dir.to_owned(),
        shutdown,
        server: server_task,
        health: health_task,
        _scratch: scratch,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubelet_sees_devices_health_and_a_restart() -> Result<()> {
    let kubelet = tempfile::Builder::new().prefix("kd").tempdir_in("/tmp")?;
    let dir = kubelet.path().join("device-plugins");
    std::fs::create_dir(&dir)?;
    let socket = dir.join("tessera-gpu.sock");
    // A stale socket of an earlier run: removed at start.
    std::fs::write(&socket, "stale")?;
    let first_kubelet = FakeKubelet::start(kubelet.path())?;
    let plugin = start_plugin(kubelet.path()).await?;

    // Registration: version, our socket's name, the resource, the options.
    let reg = first_kubelet
        .wait_registered("tessera-gpu.sock", Duration::from_secs(5))
        .await?;
    assert_eq!(first_kubelet.registrations().len(), 1, "registered once");
    assert_eq!(reg.version, "v1beta1");
    assert_eq!(reg.resource_name, "nvidia.com/gpu");
    let options = reg.options.context("registration without options")?;
    assert!(!options.pre_start_required);
    assert!(options.get_preferred_allocation_available);
    let mode = std::fs::metadata(&socket)?.permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "our socket's mode");
    let channel = server::unix_channel(&socket).await?;
    let options = dp::device_plugin_client::DevicePluginClient::new(channel)
        .get_device_plugin_options(dp::Empty {})
        .await?
        .into_inner();
    assert!(options.get_preferred_allocation_available);
    assert!(!options.pre_start_required);

    // The first list: 4 replicas of the H100, 7 MIG units of the A100.
    let mut stream = list_and_watch(&socket).await?;
    let (devices, _) = wait_list(&mut stream, Duration::from_secs(5), "any", |_| true).await?;
    let mut ids: Vec<&str> = devices.iter().map(|d| d.id.as_str()).collect();
    ids.sort_unstable();
    let mut want: Vec<String> = (0..4)
        .map(|n| format!("{H100}::{n}"))
        .chain((0..7).map(|n| format!("{A100}::mig{n}")))
        .collect();
    want.sort_unstable();
    assert_eq!(ids, want);
    assert!(devices.iter().all(|d| d.health == "Healthy"), "{devices:?}");

    // An application XID changes nothing; a critical one, inside a MIG
    // instance, marks the whole A100 within 2 s.
    plugin.driver.push_health_event(HealthEvent::Xid {
        uuid: H100.into(),
        xid: 13,
        instance: None,
    });
    plugin.driver.push_health_event(HealthEvent::Xid {
        uuid: A100.into(),
        xid: 79,
        instance: Some((1, 0)),
    });
    let (devices, took) = wait_list(
        &mut stream,
        Duration::from_secs(2),
        "the A100 is Unhealthy",
        |d| all(d, A100, "Unhealthy"),
    )
    .await?;
    println!("XID 79 → ListAndWatch Unhealthy in {took:?}");
    assert!(
        all(&devices, H100, "Healthy"),
        "XID 13 is an application's: {devices:?}"
    );

    // A lost GPU: Unhealthy within 2 s, Healthy again once it answers.
    plugin.driver.set_lost(0, true);
    let (_, took) = wait_list(
        &mut stream,
        Duration::from_secs(2),
        "the lost H100 is Unhealthy",
        |d| all(d, H100, "Unhealthy"),
    )
    .await?;
    println!("lost GPU → ListAndWatch Unhealthy in {took:?}");
    plugin.driver.set_lost(0, false);
    let (devices, took) = wait_list(
        &mut stream,
        Duration::from_secs(3),
        "the H100 is Healthy again",
        |d| all(d, H100, "Healthy"),
    )
    .await?;
    println!("GPU answering again → ListAndWatch Healthy in {took:?}");
    assert!(all(&devices, A100, "Unhealthy"), "an XID is for good");

    // kubelet restarts: it wipes the directory and listens anew. The plugin
    // serves on a fresh socket and registers again; the old stream ends.
    drop(first_kubelet);
    let restarted = Instant::now();
    for entry in std::fs::read_dir(&dir)? {
        std::fs::remove_file(entry?.path())?;
    }
    let second_kubelet = FakeKubelet::start(kubelet.path())?;
    second_kubelet
        .wait_registered("tessera-gpu.sock", Duration::from_secs(5))
        .await?;
    println!(
        "re-registered {:?} after the kubelet restart",
        restarted.elapsed()
    );
    ensure!(socket.exists(), "our socket is back");
    let ended = tokio::time::timeout(Duration::from_secs(5), stream.message()).await?;
    assert!(
        !matches!(ended, Ok(Some(_))),
        "the old ListAndWatch stream ends: {ended:?}"
    );
    let mut stream = list_and_watch(&socket).await?;
    let (devices, _) = wait_list(&mut stream, Duration::from_secs(5), "any", |_| true).await?;
    assert_eq!(devices.len(), 11);
    assert!(
        all(&devices, A100, "Unhealthy"),
        "health survives the restart"
    );

    // Stop: the stream ends, the server returns, our socket is removed.
    plugin.shutdown.send(true)?;
    let ended = tokio::time::timeout(Duration::from_secs(5), stream.message()).await?;
    assert!(
        !matches!(ended, Ok(Some(_))),
        "stream ends on stop: {ended:?}"
    );
    tokio::time::timeout(Duration::from_secs(5), plugin.server)
        .await
        .context("server stops")???;
    tokio::time::timeout(Duration::from_secs(5), plugin.health)
        .await
        .context("health stops")??;
    ensure!(!socket.exists(), "our socket is removed at the end");
    ensure!(
        plugin
            .kubelet_dir
            .join("device-plugins/kubelet.sock")
            .exists(),
        "kubelet's socket is not ours to remove"
    );
    drop(second_kubelet);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_kubelet_it_waits_and_registers_when_kubelet_comes() -> Result<()> {
    let kubelet = tempfile::Builder::new().prefix("kd").tempdir_in("/tmp")?;
    let plugin = start_plugin(kubelet.path()).await?;
    // No device-plugins dir yet: nothing served, nothing fails.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    if plugin.server.is_finished() {
        bail!(
            "the server gave up without kubelet: {:?}",
            plugin.server.await
        );
    }
    let fake = FakeKubelet::start(kubelet.path())?;
    let reg = fake
        .wait_registered("tessera-gpu.sock", Duration::from_secs(5))
        .await?;
    assert_eq!(reg.resource_name, "nvidia.com/gpu");
    plugin.shutdown.send(true)?;
    tokio::time::timeout(Duration::from_secs(5), plugin.server).await???;
    drop(fake);
    Ok(())
}
