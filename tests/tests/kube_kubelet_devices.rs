//! The kubelet stand-in's device plugin manager (v1beta1) and its
//! PodResources v1 server, driven in-process over real unix sockets in a
//! temporary kubelet dir, against a fake device plugin written the way real
//! plugins are: it serves DevicePlugin on its own socket, registers through
//! `kubelet.sock`, and when its socket vanishes (kubelet restarted and
//! wiped the dir) it serves again and re-registers. Each plugin "process"
//! runs on its own tokio runtime in its own thread, so killing it drops
//! every connection at once, as a crash does. Needs no root and no program.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use futures::StreamExt;
use tessera_kube_kubelet::devices::{
    ActivePod, AdmitError, ContainerKind, ContainerRequest, DeviceManager, Options, PodRef,
    ResourceCounts,
};
use tessera_kube_proto::deviceplugin::v1beta1 as dp;
use tessera_kube_proto::podresources::v1 as pr;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

// ---------------------------------------------------------------- helpers

/// A kubelet dir with a short path (unix socket paths are limited to 108
/// bytes, and TMPDIR may be long).
fn kubelet_dir() -> Result<tempfile::TempDir> {
    Ok(tempfile::Builder::new().prefix("kd").tempdir_in("/tmp")?)
}

fn plugins_dir(kubelet: &Path) -> PathBuf {
    kubelet.join("device-plugins")
}

async fn dial(socket: &Path) -> Result<Channel> {
    tessera_kube_proto::unix_channel(socket)
        .await
        .with_context(|| format!("dialing {}", socket.display()))
}

/// Polls `condition` until it holds (10 s at most).
async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !condition() {
        if Instant::now() > deadline {
            bail!("timed out waiting until {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

fn pod(name: &str) -> PodRef {
    PodRef {
        uid: format!("uid-{name}"),
        namespace: "default".into(),
        name: name.into(),
    }
}

fn request(resource: &str, count: u64) -> BTreeMap<String, u64> {
    [(resource.to_owned(), count)].into()
}

fn device(id: &str, healthy: bool, numa: Option<i64>) -> dp::Device {
    dp::Device {
        id: id.into(),
        health: if healthy { "Healthy" } else { "Unhealthy" }.into(),
        topology: numa.map(|n| dp::TopologyInfo {
            nodes: vec![dp::NumaNode { id: n }],
        }),
    }
}

fn healthy_devices(ids: &[&str]) -> Vec<dp::Device> {
    ids.iter().map(|id| device(id, true, None)).collect()
}

fn counts(capacity: u64, allocatable: u64) -> Option<ResourceCounts> {
    Some(ResourceCounts {
        capacity,
        allocatable,
    })
}

/// The device ids a container got, as the fake plugin encodes them in
/// the env of its Allocate response.
fn granted(envs: &BTreeMap<String, String>, resource: &str) -> Vec<String> {
    let key = env_key(resource);
    envs.get(&key)
        .map(|v| v.split(',').map(str::to_owned).collect())
        .unwrap_or_default()
}

fn env_key(resource: &str) -> String {
    format!(
        "FAKE_DEVICES_{}",
        resource
            .to_ascii_uppercase()
            .replace(|c: char| !c.is_ascii_alphanumeric(), "_")
    )
}

// ------------------------------------------------------------ fake plugin

/// How the fake plugin answers GetPreferredAllocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Preferred {
    /// It does not offer it.
    Off,
    /// The last `size` available devices (valid).
    LastN,
    /// Devices that do not exist (invalid).
    Bogus,
}

/// What the fake plugin saw.
#[derive(Debug, Default)]
struct Record {
    registrations: usize,
    /// Times the plugin saw its socket vanish and started over.
    restarts: usize,
    list_and_watch_calls: usize,
    preferred_requests: Vec<dp::ContainerPreferredAllocationRequest>,
    allocations: Vec<Vec<String>>,
    pre_starts: Vec<Vec<String>>,
}

/// A fake device plugin's settings and what it saw; outlives its processes.
struct Plugin {
    resource: String,
    endpoint: String,
    pre_start_required: bool,
    auto_register: bool,
    preferred: Mutex<Preferred>,
    fail_allocate: AtomicBool,
    devices: tokio::sync::watch::Sender<Vec<dp::Device>>,
    record: Mutex<Record>,
}

impl Plugin {
    fn new(resource: &str, devices: Vec<dp::Device>) -> Arc<Plugin> {
        Arc::new(Plugin {
            resource: resource.into(),
            endpoint: format!("{}.sock", resource.replace('/', "_")),
            pre_start_required: false,
            auto_register: true,
            preferred: Mutex::new(Preferred::Off),
            fail_allocate: AtomicBool::new(false),
            devices: tokio::sync::watch::channel(devices).0,
            record: Mutex::new(Record::default()),
        })
    }

    fn with(
        resource: &str,
        devices: Vec<dp::Device>,
        edit: impl FnOnce(&mut Plugin),
    ) -> Arc<Plugin> {
        let mut plugin = Arc::into_inner(Plugin::new(resource, devices)).expect("fresh");
        edit(&mut plugin);
        Arc::new(plugin)
    }

    fn record(&self) -> std::sync::MutexGuard<'_, Record> {
        self.record.lock().expect("record lock")
    }

    fn options(&self) -> dp::DevicePluginOptions {
        dp::DevicePluginOptions {
            pre_start_required: self.pre_start_required,
            get_preferred_allocation_available: *self.preferred.lock().expect("lock")
                != Preferred::Off,
        }
    }

    fn register_request(&self) -> dp::RegisterRequest {
        dp::RegisterRequest {
            version: "v1beta1".into(),
            endpoint: self.endpoint.clone(),
            resource_name: self.resource.clone(),
            options: Some(self.options()),
        }
    }
}

struct PluginService(Arc<Plugin>);

#[tonic::async_trait]
impl dp::device_plugin_server::DevicePlugin for PluginService {
    async fn get_device_plugin_options(
        &self,
        _: Request<dp::Empty>,
    ) -> Result<Response<dp::DevicePluginOptions>, Status> {
        Ok(Response::new(self.0.options()))
    }

    type ListAndWatchStream =
        futures::stream::BoxStream<'static, Result<dp::ListAndWatchResponse, Status>>;

    async fn list_and_watch(
        &self,
        _: Request<dp::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        self.0.record().list_and_watch_calls += 1;
        let updates = tokio_stream::wrappers::WatchStream::new(self.0.devices.subscribe())
            .map(|devices| Ok(dp::ListAndWatchResponse { devices }));
        Ok(Response::new(updates.boxed()))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<dp::PreferredAllocationRequest>,
    ) -> Result<Response<dp::PreferredAllocationResponse>, Status> {
        let mut responses = Vec::new();
        for r in request.into_inner().container_requests {
            let size = usize::try_from(r.allocation_size).unwrap_or(0);
            let ids = match *self.0.preferred.lock().expect("lock") {
                Preferred::LastN => r.available_device_i_ds
                    [r.available_device_i_ds.len().saturating_sub(size)..]
                    .to_vec(),
                Preferred::Bogus | Preferred::Off => vec!["no-such-device".to_owned(); size],
            };
            self.0.record().preferred_requests.push(r);
            responses.push(dp::ContainerPreferredAllocationResponse { device_i_ds: ids });
        }
        Ok(Response::new(dp::PreferredAllocationResponse {
            container_responses: responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<dp::AllocateRequest>,
    ) -> Result<Response<dp::AllocateResponse>, Status> {
        let mut responses = Vec::new();
        for r in request.into_inner().container_requests {
            self.0.record().allocations.push(r.devices_ids.clone());
            if self.0.fail_allocate.load(Ordering::Relaxed) {
                return Err(Status::internal("injected Allocate failure"));
            }
            let ids = r.devices_ids;
            responses.push(dp::ContainerAllocateResponse {
                envs: [(env_key(&self.0.resource), ids.join(","))].into(),
                mounts: vec![dp::Mount {
                    container_path: format!("/run/{}", self.0.endpoint),
                    host_path: "/var/run/fake".into(),
                    read_only: true,
                }],
                devices: ids
                    .iter()
                    .map(|id| dp::DeviceSpec {
                        container_path: format!("/dev/fake-{id}"),
                        host_path: format!("/dev/fake-{id}"),
                        permissions: "rw".into(),
                    })
                    .collect(),
                annotations: [(format!("fake/{}", self.0.endpoint), ids.join(","))].into(),
                cdi_devices: ids
                    .iter()
                    .map(|id| dp::CdiDevice {
                        name: format!("example.com/fake={id}"),
                    })
                    .collect(),
            });
        }
        Ok(Response::new(dp::AllocateResponse {
            container_responses: responses,
        }))
    }

    async fn pre_start_container(
        &self,
        request: Request<dp::PreStartContainerRequest>,
    ) -> Result<Response<dp::PreStartContainerResponse>, Status> {
        self.0
            .record()
            .pre_starts
            .push(request.into_inner().devices_ids);
        Ok(Response::new(dp::PreStartContainerResponse {}))
    }
}

/// One run of a fake plugin, on its own runtime; dropping it kills it.
struct PluginProcess {
    kill: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PluginProcess {
    fn spawn(plugins_dir: &Path, plugin: &Arc<Plugin>) -> PluginProcess {
        let (kill, killed) = tokio::sync::oneshot::channel::<()>();
        let dir = plugins_dir.to_owned();
        let plugin = Arc::clone(plugin);
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("plugin runtime");
            runtime.block_on(async {
                tokio::select! {
                    _ = killed => {}
                    result = plugin_main(dir, plugin) => {
                        if let Err(e) = result {
                            eprintln!("fake plugin stopped: {e:#}");
                        }
                    }
                }
            });
            // Like SIGKILL: every task and connection of the plugin goes.
            runtime.shutdown_background();
        });
        PluginProcess {
            kill: Some(kill),
            thread: Some(thread),
        }
    }
}

impl Drop for PluginProcess {
    fn drop(&mut self) {
        if let Some(kill) = self.kill.take() {
            let _ = kill.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The plugin's life, as real plugins live it: serve, register, and start
/// over when kubelet wipes the socket dir.
async fn plugin_main(dir: PathBuf, plugin: Arc<Plugin>) -> Result<()> {
    let socket = dir.join(&plugin.endpoint);
    let kubelet = dir.join("kubelet.sock");
    loop {
        let _ = std::fs::remove_file(&socket);
        let listener = tokio::net::UnixListener::bind(&socket)
            .with_context(|| format!("binding {}", socket.display()))?;
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(dp::device_plugin_server::DevicePluginServer::new(
                    PluginService(Arc::clone(&plugin)),
                ))
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
        );
        if plugin.auto_register {
            // Kubelet may be restarting: try until its socket answers.
            loop {
                match register(&kubelet, plugin.register_request()).await {
                    Ok(()) => break,
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
            plugin.record().registrations += 1;
        }
        while socket.exists() {
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        server.abort();
        plugin.record().restarts += 1;
    }
}

async fn register(kubelet_socket: &Path, request: dp::RegisterRequest) -> Result<(), Status> {
    let channel = dial(kubelet_socket)
        .await
        .map_err(|e| Status::unavailable(format!("{e:#}")))?;
    dp::registration_client::RegistrationClient::new(channel)
        .register(request)
        .await
        .map(|_| ())
}

/// A manager and a plugin registered with it, devices listed.
async fn started(
    kubelet: &Path,
    plugin: &Arc<Plugin>,
) -> Result<(Arc<DeviceManager>, PluginProcess)> {
    started_with(kubelet, plugin, Options::default()).await
}

/// [`started`] with `options`.
async fn started_with(
    kubelet: &Path,
    plugin: &Arc<Plugin>,
    options: Options,
) -> Result<(Arc<DeviceManager>, PluginProcess)> {
    let manager = DeviceManager::start_with(kubelet, options).await?;
    let process = PluginProcess::spawn(&plugins_dir(kubelet), plugin);
    let n = plugin.devices.borrow().len() as u64;
    let healthy = plugin
        .devices
        .borrow()
        .iter()
        .filter(|d| d.health == "Healthy")
        .count() as u64;
    wait_until("the plugin's devices are listed", || {
        manager.resources().get(&plugin.resource).copied() == counts(n, healthy)
    })
    .await?;
    Ok((manager, process))
}

// ------------------------------------------------------------------ tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registered_plugin_devices_become_capacity_and_allocatable() -> Result<()> {
    let dir = kubelet_dir()?;
    let manager = DeviceManager::start(dir.path()).await?;
    assert!(plugins_dir(dir.path()).join("kubelet.sock").exists());
    assert!(dir.path().join("pod-resources/kubelet.sock").exists());
    let mut changes = manager.changes();
    assert!(manager.resources().is_empty());

    let plugin = Plugin::new(
        "example.com/dev",
        vec![
            device("d0", true, None),
            device("d1", true, None),
            device("d2", true, None),
            device("d3", false, None),
        ],
    );
    let _process = PluginProcess::spawn(&plugins_dir(dir.path()), &plugin);
    tokio::time::timeout(Duration::from_secs(10), changes.changed())
        .await
        .context("no change after registration")??;
    wait_until("4 devices, 3 healthy", || {
        manager.resources().get("example.com/dev").copied() == counts(4, 3)
    })
    .await?;
    assert!(manager.manages("example.com/dev"));
    assert!(!manager.manages("example.com/other"));
    assert_eq!(plugin.record().list_and_watch_calls, 1);

    // Every ListAndWatch message replaces the list.
    changes.borrow_and_update();
    plugin
        .devices
        .send_replace(vec![device("d3", true, None), device("d4", true, None)]);
    tokio::time::timeout(Duration::from_secs(10), changes.changed())
        .await
        .context("no change after a new device list")??;
    wait_until("2 devices, 2 healthy", || {
        manager.resources().get("example.com/dev").copied() == counts(2, 2)
    })
    .await?;
    manager.shutdown().await;
    assert!(!plugins_dir(dir.path()).join("kubelet.sock").exists());
    assert!(!dir.path().join("pod-resources/kubelet.sock").exists());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_registrations_are_refused_and_change_nothing() -> Result<()> {
    let dir = kubelet_dir()?;
    let manager = DeviceManager::start(dir.path()).await?;
    let kubelet = plugins_dir(dir.path()).join("kubelet.sock");
    // A live plugin inside the dir, and one outside it that a path
    // traversal in `endpoint` would reach.
    let inside = Plugin::with("example.com/dev", healthy_devices(&["d0"]), |p| {
        p.auto_register = false;
    });
    let _inside = PluginProcess::spawn(&plugins_dir(dir.path()), &inside);
    let outside = Plugin::with("example.com/dev", healthy_devices(&["d0"]), |p| {
        p.auto_register = false;
        p.endpoint = "outside.sock".into();
    });
    let _outside = PluginProcess::spawn(dir.path(), &outside);
    wait_until("both plugins serve", || {
        plugins_dir(dir.path()).join(&inside.endpoint).exists()
            && dir.path().join("outside.sock").exists()
    })
    .await?;

    let good = inside.register_request();
    let cases = [
        (
            "version",
            dp::RegisterRequest {
                version: "v1alpha1".into(),
                ..good.clone()
            },
        ),
        (
            "version",
            dp::RegisterRequest {
                version: String::new(),
                ..good.clone()
            },
        ),
        (
            "resource_name",
            dp::RegisterRequest {
                resource_name: "kubernetes.io/x".into(),
                ..good.clone()
            },
        ),
        (
            "resource_name",
            dp::RegisterRequest {
                resource_name: "gpu".into(),
                ..good.clone()
            },
        ),
        (
            "resource_name",
            dp::RegisterRequest {
                resource_name: "Example.com/x".into(),
                ..good.clone()
            },
        ),
        (
            "endpoint",
            dp::RegisterRequest {
                endpoint: "../outside.sock".into(),
                ..good.clone()
            },
        ),
        (
            "endpoint",
            dp::RegisterRequest {
                endpoint: "x/../../outside.sock".into(),
                ..good.clone()
            },
        ),
        (
            "endpoint",
            dp::RegisterRequest {
                endpoint: "kubelet.sock".into(),
                ..good.clone()
            },
        ),
    ];
    for (field, bad) in cases {
        let status = register(&kubelet, bad.clone())
            .await
            .expect_err(&format!("{bad:?} must be refused"));
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{bad:?}: {status:?}"
        );
        assert!(
            status.message().starts_with(field),
            "{bad:?}: {}",
            status.message()
        );
    }
    // A sound request naming a socket nobody serves fails too.
    let status = register(
        &kubelet,
        dp::RegisterRequest {
            endpoint: "missing.sock".into(),
            ..good.clone()
        },
    )
    .await
    .expect_err("a missing socket must fail");
    assert!(status.message().contains("missing.sock"), "{status:?}");

    assert!(manager.resources().is_empty(), "{:?}", manager.resources());
    assert!(!manager.manages("example.com/dev"));
    assert_eq!(inside.record().list_and_watch_calls, 0);
    assert_eq!(outside.record().list_and_watch_calls, 0);

    // The positive control: the same plugin, registered soundly.
    register(&kubelet, good).await?;
    wait_until("the good registration lists d0", || {
        manager.resources().get("example.com/dev").copied() == counts(1, 1)
    })
    .await?;
    assert_eq!(outside.record().list_and_watch_calls, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_pods_never_share_a_device() -> Result<()> {
    let dir = kubelet_dir()?;
    let mut devices: Vec<dp::Device> = (0..20)
        .map(|i| device(&format!("d{i:02}"), true, None))
        .collect();
    devices.push(device("sick0", false, None));
    devices.push(device("sick1", false, None));
    let plugin = Plugin::new("example.com/dev", devices);
    let (manager, _process) = started(dir.path(), &plugin).await?;

    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let manager = Arc::clone(&manager);
            tokio::spawn(async move {
                manager
                    .allocate(
                        &pod(&format!("p{i}")),
                        "main",
                        &request("example.com/dev", 1),
                    )
                    .await
            })
        })
        .collect();
    let mut seen = BTreeSet::new();
    for task in tasks {
        let allocation = task.await?.map_err(|e| anyhow::anyhow!("{e}"))?;
        let ids = granted(&allocation.envs, "example.com/dev");
        ensure!(ids.len() == 1, "one device per pod, got {ids:?}");
        ensure!(
            !ids[0].starts_with("sick"),
            "an unhealthy device was handed out: {ids:?}"
        );
        ensure!(
            seen.insert(ids[0].clone()),
            "device {} handed out twice",
            ids[0]
        );
        assert_eq!(
            allocation.cdi_devices,
            vec![format!("example.com/fake={}", ids[0])]
        );
        assert_eq!(
            allocation.devices[0].container_path,
            format!("/dev/fake-{}", ids[0])
        );
    }
    assert_eq!(seen.len(), 20);
    let plugin_saw: BTreeSet<String> = plugin
        .record()
        .allocations
        .iter()
        .flatten()
        .cloned()
        .collect();
    assert_eq!(
        plugin_saw, seen,
        "the plugin was asked for exactly the devices handed out"
    );
    assert!(
        plugin.record().preferred_requests.is_empty(),
        "preferred allocation not offered, not asked"
    );

    // The 21st pod finds nothing: kubelet's admission message.
    let err = manager
        .allocate(&pod("p20"), "main", &request("example.com/dev", 1))
        .await
        .expect_err("no device left");
    assert_eq!(
        err.to_string(),
        "Allocate failed due to requested number of devices unavailable for example.com/dev. Requested: 1, Available: 0, which is unexpected"
    );
    assert!(matches!(
        err,
        AdmitError::Unavailable {
            requested: 1,
            available: 0,
            ..
        }
    ));

    // Allocatable is not reduced by assignments (that is the scheduler's job).
    assert_eq!(
        manager.resources().get("example.com/dev").copied(),
        counts(22, 20)
    );

    // A container restart gets the same answer without a plugin call.
    let again = manager
        .allocate(&pod("p3"), "main", &request("example.com/dev", 1))
        .await?;
    let first = manager.container_devices("uid-p3", "main");
    assert_eq!(
        Some(&granted(&again.envs, "example.com/dev")),
        first.get("example.com/dev")
    );
    assert_eq!(plugin.record().allocations.len(), 20);

    // Freed pods give their devices back.
    let active: BTreeSet<String> = (0..19).map(|i| format!("uid-p{i}")).collect();
    manager.retain_pods(&active);
    let freed = manager
        .allocate(&pod("p20"), "main", &request("example.com/dev", 1))
        .await?;
    assert_eq!(
        granted(&freed.envs, "example.com/dev"),
        manager.container_devices("uid-p20", "main")["example.com/dev"]
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preferred_allocation_is_used_when_valid_and_ignored_when_not() -> Result<()> {
    let dir = kubelet_dir()?;
    let plugin = Plugin::with(
        "example.com/dev",
        healthy_devices(&["d0", "d1", "d2", "d3", "d4", "d5"]),
        |p| *p.preferred.get_mut().expect("lock") = Preferred::LastN,
    );
    let (manager, _process) = started(dir.path(), &plugin).await?;

    let first = manager
        .allocate(&pod("a"), "main", &request("example.com/dev", 2))
        .await?;
    assert_eq!(granted(&first.envs, "example.com/dev"), ["d4", "d5"]);
    {
        let record = plugin.record();
        let asked = &record.preferred_requests[0];
        assert_eq!(
            asked.available_device_i_ds,
            ["d0", "d1", "d2", "d3", "d4", "d5"]
        );
        assert!(asked.must_include_device_i_ds.is_empty());
        assert_eq!(asked.allocation_size, 2);
        assert_eq!(record.allocations, [["d4", "d5"]]);
    }

    // An answer naming devices that do not exist is ignored.
    *plugin.preferred.lock().expect("lock") = Preferred::Bogus;
    let second = manager
        .allocate(&pod("b"), "main", &request("example.com/dev", 2))
        .await?;
    assert_eq!(granted(&second.envs, "example.com/dev"), ["d0", "d1"]);
    let record = plugin.record();
    assert_eq!(
        record.preferred_requests[1].available_device_i_ds,
        ["d0", "d1", "d2", "d3"]
    );
    assert_eq!(record.allocations[1], ["d0", "d1"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pre_start_is_called_only_for_plugins_that_ask() -> Result<()> {
    let dir = kubelet_dir()?;
    let asks = Plugin::with("example.com/a", healthy_devices(&["a0", "a1"]), |p| {
        p.pre_start_required = true
    });
    let quiet = Plugin::new("example.com/b", healthy_devices(&["b0", "b1"]));
    let (manager, _a) = started(dir.path(), &asks).await?;
    let _b = PluginProcess::spawn(&plugins_dir(dir.path()), &quiet);
    wait_until("both resources listed", || manager.resources().len() == 2).await?;

    let requests: BTreeMap<String, u64> = [
        ("example.com/a".to_owned(), 2),
        ("example.com/b".to_owned(), 1),
    ]
    .into();
    let allocation = manager.allocate(&pod("p"), "main", &requests).await?;
    assert_eq!(
        allocation.cdi_devices,
        [
            "example.com/fake=a0",
            "example.com/fake=a1",
            "example.com/fake=b0"
        ]
    );
    assert_eq!(allocation.mounts.len(), 2);
    assert_eq!(allocation.annotations.len(), 2);
    assert_eq!(granted(&allocation.envs, "example.com/a"), ["a0", "a1"]);
    assert_eq!(granted(&allocation.envs, "example.com/b"), ["b0"]);
    assert!(
        asks.record().pre_starts.is_empty(),
        "no PreStartContainer before pre_start"
    );

    manager
        .pre_start(&pod("p"), "main")
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    assert_eq!(asks.record().pre_starts, [["a0", "a1"]]);
    assert!(quiet.record().pre_starts.is_empty());
    // A container without devices calls nobody.
    manager
        .pre_start(&pod("p"), "sidecar")
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    assert_eq!(asks.record().pre_starts.len(), 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_allocate_assigns_nothing() -> Result<()> {
    let dir = kubelet_dir()?;
    let good = Plugin::new("example.com/a", healthy_devices(&["a0"]));
    let failing = Plugin::new("example.com/b", healthy_devices(&["b0"]));
    failing.fail_allocate.store(true, Ordering::Relaxed);
    let (manager, _a) = started(dir.path(), &good).await?;
    let _b = PluginProcess::spawn(&plugins_dir(dir.path()), &failing);
    wait_until("both resources listed", || manager.resources().len() == 2).await?;

    let both: BTreeMap<String, u64> = [
        ("example.com/a".to_owned(), 1),
        ("example.com/b".to_owned(), 1),
    ]
    .into();
    let err = manager
        .allocate(&pod("p"), "main", &both)
        .await
        .expect_err("b fails");
    assert!(
        matches!(&err, AdmitError::Plugin { resource, call: "Allocate", message } if resource == "example.com/b" && message.contains("injected")),
        "{err:?}"
    );
    assert!(
        manager.container_devices("uid-p", "main").is_empty(),
        "nothing stays assigned"
    );

    // a0 is free again: another pod gets it.
    let other = manager
        .allocate(&pod("q"), "main", &request("example.com/a", 1))
        .await?;
    assert_eq!(granted(&other.envs, "example.com/a"), ["a0"]);
    // And b0 once the plugin answers.
    failing.fail_allocate.store(false, Ordering::Relaxed);
    let retry = manager
        .allocate(&pod("p"), "main", &request("example.com/b", 1))
        .await?;
    assert_eq!(granted(&retry.envs, "example.com/b"), ["b0"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_killed_mid_list_and_watch_turns_devices_unhealthy_until_it_registers_again()
-> Result<()> {
    let dir = kubelet_dir()?;
    let plugin = Plugin::new("example.com/dev", healthy_devices(&["d0", "d1", "d2"]));
    let (manager, process) = started(dir.path(), &plugin).await?;
    let held = manager
        .allocate(&pod("a"), "main", &request("example.com/dev", 1))
        .await?;

    drop(process); // killed
    wait_until("all devices unhealthy, capacity kept", || {
        manager.resources().get("example.com/dev").copied() == counts(3, 0)
    })
    .await?;
    assert!(
        manager.manages("example.com/dev"),
        "the resource stays known"
    );
    let err = manager
        .allocate(&pod("b"), "main", &request("example.com/dev", 1))
        .await
        .expect_err("no healthy device while the plugin is down");
    assert_eq!(
        err.to_string(),
        "no healthy devices present; cannot allocate unhealthy devices example.com/dev"
    );
    // Admitting a container that holds devices but is not running checks
    // them, as kubelet does after a node reboot...
    let err = manager
        .allocate(&pod("a"), "main", &request("example.com/dev", 1))
        .await
        .expect_err("its devices are not healthy");
    assert!(
        matches!(err, AdmitError::NoHealthyDevices { .. }),
        "{err:?}"
    );
    // ...while a running one, or one restarting, keeps them unchecked.
    assert_eq!(manager.reuse_running(&pod("a"), "main"), held);
    assert_eq!(manager.container_devices("uid-a", "main").len(), 1);

    let _restarted = PluginProcess::spawn(&plugins_dir(dir.path()), &plugin);
    wait_until("healthy again after re-registration", || {
        manager.resources().get("example.com/dev").copied() == counts(3, 3)
    })
    .await?;
    assert_eq!(plugin.record().registrations, 2);
    // The held device turns unhealthy, others stay healthy: admitting the
    // container again is refused, kubelet's way.
    let held_id = granted(&held.envs, "example.com/dev")[0].clone();
    let ids = ["d0", "d1", "d2"];
    plugin.devices.send_replace(
        ids.iter()
            .map(|id| device(id, *id != held_id, None))
            .collect(),
    );
    wait_until("the held device unhealthy", || {
        manager.resources().get("example.com/dev").copied() == counts(3, 2)
    })
    .await?;
    let err = manager
        .allocate(&pod("a"), "main", &request("example.com/dev", 1))
        .await
        .expect_err("its device is unhealthy");
    assert_eq!(
        err.to_string(),
        "previously allocated devices are no longer healthy; cannot allocate unhealthy devices example.com/dev"
    );
    plugin.devices.send_replace(healthy_devices(&ids));
    wait_until("all healthy", || {
        manager.resources().get("example.com/dev").copied() == counts(3, 3)
    })
    .await?;
    let allocations = plugin.record().allocations.len();
    let again = manager
        .allocate(&pod("a"), "main", &request("example.com/dev", 1))
        .await?;
    assert_eq!(again, held);
    assert_eq!(
        plugin.record().allocations.len(),
        allocations,
        "no new Allocate"
    );
    let b = manager
        .allocate(&pod("b"), "main", &request("example.com/dev", 1))
        .await?;
    assert_ne!(
        granted(&b.envs, "example.com/dev"),
        granted(&held.envs, "example.com/dev")
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manager_restart_restores_the_checkpoint_and_the_plugin_registers_again() -> Result<()> {
    let dir = kubelet_dir()?;
    let plugin = Plugin::new("example.com/dev", healthy_devices(&["d0", "d1", "d2"]));
    let (manager, _process) = started(dir.path(), &plugin).await?;
    let held = manager
        .allocate(&pod("a"), "main", &request("example.com/dev", 1))
        .await?;
    let held_ids = granted(&held.envs, "example.com/dev");
    manager.shutdown().await;
    drop(manager);
    let checkpoint = plugins_dir(dir.path()).join("kubelet_internal_checkpoint");
    assert!(checkpoint.exists(), "the checkpoint survives shutdown");
    // A stale socket of a plugin that died, and things that are no
    // sockets: only the socket goes.
    let stale = plugins_dir(dir.path()).join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale)?);
    let notes = plugins_dir(dir.path()).join("notes.txt");
    std::fs::write(&notes, b"an operator's file")?;
    std::fs::create_dir(plugins_dir(dir.path()).join("subdir"))?;

    let manager = DeviceManager::start(dir.path()).await?;
    assert!(!stale.exists(), "start removes the plugin sockets");
    assert_eq!(std::fs::read(&notes)?, b"an operator's file");
    assert!(plugins_dir(dir.path()).join("subdir").is_dir());
    // Before the plugin is back, the container keeps its devices only if it
    // is still running (a kubelet restart); if not (a node reboot) its
    // admission fails, as kubelet's does.
    let err = manager
        .allocate(&pod("a"), "main", &request("example.com/dev", 1))
        .await
        .expect_err("the plugin has not registered again");
    assert!(
        matches!(err, AdmitError::NoHealthyDevices { .. }),
        "{err:?}"
    );
    let running = ContainerRequest {
        name: "main".into(),
        kind: ContainerKind::App,
        requests: request("example.com/dev", 1),
        running: true,
    };
    let admitted = manager.admit_pod(&pod("a"), &[running]).await?;
    assert_eq!(admitted["main"], held);
    assert_eq!(plugin.record().allocations.len(), 1);

    // The plugin noticed its socket vanish and registered again.
    wait_until("the plugin re-registers and lists its devices", || {
        manager.resources().get("example.com/dev").copied() == counts(3, 3)
    })
    .await?;
    {
        let record = plugin.record();
        assert_eq!(record.restarts, 1, "{record:?}");
        assert_eq!(record.registrations, 2, "{record:?}");
    }
    // With its devices healthy again, the container that is not running
    // gets the same response, without Allocate.
    let again = manager
        .allocate(&pod("a"), "main", &request("example.com/dev", 1))
        .await?;
    assert_eq!(again, held);
    assert_eq!(plugin.record().allocations.len(), 1);
    // The restored assignment still holds its device.
    for name in ["b", "c"] {
        let other = manager
            .allocate(&pod(name), "main", &request("example.com/dev", 1))
            .await?;
        assert_ne!(
            granted(&other.envs, "example.com/dev"),
            held_ids,
            "pod {name} got a held device"
        );
    }
    let err = manager
        .allocate(&pod("d"), "main", &request("example.com/dev", 1))
        .await
        .expect_err("all three are held");
    assert!(matches!(err, AdmitError::Unavailable { .. }), "{err:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_checkpoint_is_set_aside_and_the_manager_starts_empty() -> Result<()> {
    let dir = kubelet_dir()?;
    let plugin = Plugin::new("example.com/dev", healthy_devices(&["d0", "d1"]));
    let (manager, process) = started(dir.path(), &plugin).await?;
    manager
        .allocate(&pod("a"), "main", &request("example.com/dev", 1))
        .await?;
    manager.shutdown().await;
    drop(manager);
    drop(process);

    // One changed byte: the checksum no longer matches.
    let checkpoint = plugins_dir(dir.path()).join("kubelet_internal_checkpoint");
    let text = std::fs::read_to_string(&checkpoint)?;
    let edited = text.replacen("uid-a", "uid-x", 1);
    assert_ne!(text, edited);
    std::fs::write(&checkpoint, &edited)?;

    let manager = DeviceManager::start(dir.path()).await?;
    assert!(manager.resources().is_empty(), "{:?}", manager.resources());
    assert!(manager.container_devices("uid-x", "main").is_empty());
    assert!(manager.container_devices("uid-a", "main").is_empty());
    let aside: Vec<PathBuf> = std::fs::read_dir(plugins_dir(dir.path()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.to_string_lossy()
                .contains("kubelet_internal_checkpoint.corrupt-")
        })
        .collect();
    assert_eq!(aside.len(), 1, "the bad file is kept aside");
    assert_eq!(std::fs::read_to_string(&aside[0])?, edited);

    // Garbage, too.
    manager.shutdown().await;
    drop(manager);
    std::fs::write(&checkpoint, b"{\"Data\": [garbage")?;
    let manager = DeviceManager::start(dir.path()).await?;
    assert!(manager.resources().is_empty());

    // It works normally from there, and its new checkpoint restores.
    let _process = PluginProcess::spawn(&plugins_dir(dir.path()), &plugin);
    wait_until("the plugin registers", || {
        manager.resources().get("example.com/dev").copied() == counts(2, 2)
    })
    .await?;
    let fresh = manager
        .allocate(&pod("z"), "main", &request("example.com/dev", 2))
        .await?;
    manager.shutdown().await;
    drop(manager);
    let manager = DeviceManager::start(dir.path()).await?;
    assert_eq!(manager.reuse_running(&pod("z"), "main"), fresh);
    wait_until("the plugin registers again", || {
        manager.resources().get("example.com/dev").copied() == counts(2, 2)
    })
    .await?;
    assert_eq!(
        manager
            .allocate(&pod("z"), "main", &request("example.com/dev", 2))
            .await?,
        fresh
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_resources_answers_list_get_and_allocatable_over_its_socket() -> Result<()> {
    let dir = kubelet_dir()?;
    let plugin = Plugin::new(
        "example.com/dev",
        vec![
            device("d0", true, Some(0)),
            device("d1", true, Some(0)),
            device("d2", true, Some(1)),
            device("d3", true, None),
            device("d4", false, Some(1)),
        ],
    );
    let options = Options {
        pod_resources_get: true,
    };
    let (manager, _process) = started_with(dir.path(), &plugin, options).await?;
    let web = PodRef {
        uid: "uid-web".into(),
        namespace: "ns1".into(),
        name: "web".into(),
    };
    let db = PodRef {
        uid: "uid-db".into(),
        namespace: "ns2".into(),
        name: "db".into(),
    };
    manager
        .allocate(&web, "c1", &request("example.com/dev", 2))
        .await?;
    manager
        .allocate(&web, "c2", &request("example.com/dev", 1))
        .await?;
    manager
        .allocate(&db, "main", &request("example.com/dev", 1))
        .await?;

    let socket = dir.path().join("pod-resources/kubelet.sock");
    let client = || async {
        Ok::<_, anyhow::Error>(
            pr::pod_resources_lister_client::PodResourcesListerClient::new(dial(&socket).await?),
        )
    };
    let numa = |n: i64| {
        Some(pr::TopologyInfo {
            nodes: vec![pr::NumaNode { id: n }],
        })
    };
    // One entry per device, as kubelet reports them.
    let device = |id: &str, topology: Option<pr::TopologyInfo>| pr::ContainerDevices {
        resource_name: "example.com/dev".into(),
        device_ids: vec![id.to_owned()],
        topology,
    };
    let container = |name: &str, devices: Vec<pr::ContainerDevices>| pr::ContainerResources {
        name: name.into(),
        devices,
        ..Default::default()
    };
    let expected_web = pr::PodResources {
        name: "web".into(),
        namespace: "ns1".into(),
        containers: vec![
            container("c1", vec![device("d0", numa(0)), device("d1", numa(0))]),
            container("c2", vec![device("d2", numa(1))]),
        ],
    };
    let expected_db = pr::PodResources {
        name: "db".into(),
        namespace: "ns2".into(),
        containers: vec![container("main", vec![device("d3", None)])],
    };

    // Several clients at once, as a node runs several reconcilers.
    let lists = futures::future::join_all((0..5).map(|_| async {
        let mut c = client().await?;
        Ok::<_, anyhow::Error>(c.list(pr::ListPodResourcesRequest {}).await?.into_inner())
    }))
    .await;
    for list in lists {
        let mut pods = list?.pod_resources;
        pods.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(pods, vec![expected_db.clone(), expected_web.clone()]);
    }

    let mut c = client().await?;
    let allocatable = c
        .get_allocatable_resources(pr::AllocatableResourcesRequest {})
        .await?
        .into_inner();
    let mut got: Vec<(String, Option<i64>)> = allocatable
        .devices
        .iter()
        .map(|d| {
            assert_eq!(d.device_ids.len(), 1, "{d:?}");
            (
                d.device_ids[0].clone(),
                d.topology.as_ref().map(|t| t.nodes[0].id),
            )
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            ("d0".to_owned(), Some(0)),
            ("d1".into(), Some(0)),
            ("d2".into(), Some(1)),
            ("d3".into(), None)
        ],
        "every healthy device, held or not; never the unhealthy d4"
    );

    let one = c
        .get(pr::GetPodResourcesRequest {
            pod_name: "web".into(),
            pod_namespace: "ns1".into(),
        })
        .await?
        .into_inner();
    assert_eq!(one.pod_resources, Some(expected_web));
    // Kubelet's errors are plain ones: gRPC Unknown.
    let missing = c
        .get(pr::GetPodResourcesRequest {
            pod_name: "web".into(),
            pod_namespace: "ns2".into(),
        })
        .await
        .expect_err("web is not in ns2");
    assert_eq!(missing.code(), tonic::Code::Unknown);
    assert_eq!(missing.message(), "pod web in namespace ns2 not found");
    let idle = PodRef {
        uid: "uid-idle".into(),
        namespace: "ns1".into(),
        name: "idle".into(),
    };
    let missing = c
        .get(pr::GetPodResourcesRequest {
            pod_name: "idle".into(),
            pod_namespace: "ns1".into(),
        })
        .await
        .expect_err("a pod without devices nobody told of is unknown");
    assert_eq!(missing.code(), tonic::Code::Unknown);

    // Told of the node's pods, PodResources knows those without devices
    // too, with every container; a pod that is gone leaves it.
    manager.set_active_pods(&[
        ActivePod {
            pod: idle.clone(),
            containers: vec!["app".into(), "helper".into()],
        },
        ActivePod {
            pod: db.clone(),
            containers: vec!["main".into(), "log".into()],
        },
    ]);
    let expected_idle = pr::PodResources {
        name: "idle".into(),
        namespace: "ns1".into(),
        containers: vec![container("app", vec![]), container("helper", vec![])],
    };
    let one = c
        .get(pr::GetPodResourcesRequest {
            pod_name: "idle".into(),
            pod_namespace: "ns1".into(),
        })
        .await?
        .into_inner();
    assert_eq!(one.pod_resources, Some(expected_idle.clone()));
    let mut expected_db = expected_db;
    expected_db.containers.push(container("log", vec![]));
    let mut pods = c
        .list(pr::ListPodResourcesRequest {})
        .await?
        .into_inner()
        .pod_resources;
    pods.sort_by(|a, b| a.name.cmp(&b.name));
    assert_eq!(pods, vec![expected_db, expected_idle]);
    assert!(
        manager.container_devices("uid-web", "c1").is_empty(),
        "web's devices are freed"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_registration_replaces_the_first() -> Result<()> {
    let dir = kubelet_dir()?;
    let old = Plugin::with("example.com/dev", healthy_devices(&["d0", "d1"]), |p| {
        p.endpoint = "old.sock".into();
    });
    let new = Plugin::with(
        "example.com/dev",
        healthy_devices(&["e0", "e1", "e2"]),
        |p| {
            p.endpoint = "new.sock".into();
        },
    );
    let (manager, old_process) = started(dir.path(), &old).await?;
    let _new_process = PluginProcess::spawn(&plugins_dir(dir.path()), &new);
    wait_until("the new plugin's devices replace the old ones", || {
        manager.resources().get("example.com/dev").copied() == counts(3, 3)
    })
    .await?;

    // The old plugin's later news no longer counts: neither a new list nor
    // its death.
    old.devices.send_replace(healthy_devices(&["d0"]));
    drop(old_process);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        manager.resources().get("example.com/dev").copied(),
        counts(3, 3)
    );
    let allocation = manager
        .allocate(&pod("p"), "main", &request("example.com/dev", 3))
        .await?;
    assert_eq!(
        granted(&allocation.envs, "example.com/dev"),
        ["e0", "e1", "e2"]
    );
    assert!(old.record().allocations.is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_resources_get_is_off_by_default_as_kubelets_feature_gate() -> Result<()> {
    let dir = kubelet_dir()?;
    let plugin = Plugin::new("example.com/dev", healthy_devices(&["d0"]));
    let (manager, _process) = started(dir.path(), &plugin).await?;
    manager
        .allocate(&pod("p"), "main", &request("example.com/dev", 1))
        .await?;
    let mut c = pr::pod_resources_lister_client::PodResourcesListerClient::new(
        dial(&dir.path().join("pod-resources/kubelet.sock")).await?,
    );
    let status = c
        .get(pr::GetPodResourcesRequest {
            pod_name: "p".into(),
            pod_namespace: "default".into(),
        })
        .await
        .expect_err("Get is behind a feature gate");
    assert_eq!(status.code(), tonic::Code::Unknown);
    assert_eq!(status.message(), "PodResources API Get method disabled");
    // List is always on.
    let list = c.list(pr::ListPodResourcesRequest {}).await?.into_inner();
    assert_eq!(list.pod_resources.len(), 1);
    Ok(())
}

fn container_request(name: &str, kind: ContainerKind, count: u64) -> ContainerRequest {
    ContainerRequest {
        name: name.into(),
        kind,
        requests: request("example.com/dev", count),
        running: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn app_containers_reuse_the_devices_of_finished_init_containers() -> Result<()> {
    let dir = kubelet_dir()?;
    let plugin = Plugin::new("example.com/dev", healthy_devices(&["d0", "d1", "d2"]));
    let (manager, _process) = started(dir.path(), &plugin).await?;
    // A scheduler counts max(init, sum(app)) = max(2, 1 + 1) = 2 devices.
    let p = pod("p");
    let admitted = manager
        .admit_pod(
            &p,
            &[
                container_request("init", ContainerKind::Init, 2),
                container_request("c1", ContainerKind::App, 1),
                container_request("c2", ContainerKind::App, 1),
            ],
        )
        .await?;
    let init = granted(&admitted["init"].envs, "example.com/dev");
    let c1 = granted(&admitted["c1"].envs, "example.com/dev");
    let c2 = granted(&admitted["c2"].envs, "example.com/dev");
    assert_eq!(init.len(), 2);
    assert_ne!(c1, c2, "app containers never share");
    let apps: BTreeSet<String> = c1.iter().chain(&c2).cloned().collect();
    let inits: BTreeSet<String> = init.iter().cloned().collect();
    assert_eq!(apps, inits, "the apps took the init container's devices");
    // Every container got its own Allocate call.
    assert_eq!(plugin.record().allocations.len(), 3);
    // The third device is still free for another pod: 2 used, not 4.
    let other = manager
        .allocate(&pod("q"), "main", &request("example.com/dev", 1))
        .await?;
    let other = granted(&other.envs, "example.com/dev");
    assert!(!inits.contains(&other[0]), "{other:?}");

    // A sidecar (restartable init container) keeps running: its devices are
    // not handed on; an app container reuses only what the plain init
    // container held. Two devices for sidecar + max(init, app).
    manager.retain_pods(&["uid-r".to_owned()].into());
    let admitted = manager
        .admit_pod(
            &pod("r"),
            &[
                container_request("sidecar", ContainerKind::SidecarInit, 1),
                container_request("init", ContainerKind::Init, 1),
                container_request("app", ContainerKind::App, 1),
            ],
        )
        .await?;
    let sidecar = granted(&admitted["sidecar"].envs, "example.com/dev");
    let init = granted(&admitted["init"].envs, "example.com/dev");
    let app = granted(&admitted["app"].envs, "example.com/dev");
    assert_ne!(sidecar, init);
    assert_eq!(app, init);
    assert_eq!(
        manager.container_devices("uid-r", "app"),
        manager.container_devices("uid-r", "init")
    );

    // Without reuse the same pod does not fit, and admitting it is all or
    // nothing.
    manager.retain_pods(&BTreeSet::new());
    let err = manager
        .admit_pod(
            &pod("s"),
            &[
                container_request("init", ContainerKind::App, 2),
                container_request("c1", ContainerKind::App, 1),
                container_request("c2", ContainerKind::App, 1),
            ],
        )
        .await
        .expect_err("4 devices wanted, 3 there");
    assert!(matches!(err, AdmitError::Unavailable { .. }), "{err:?}");
    assert!(manager.container_devices("uid-s", "init").is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_preferred_allocation_is_asked_to_include_reused_devices() -> Result<()> {
    let dir = kubelet_dir()?;
    let plugin = Plugin::with(
        "example.com/dev",
        healthy_devices(&["d0", "d1", "d2", "d3"]),
        |p| *p.preferred.get_mut().expect("lock") = Preferred::LastN,
    );
    let (manager, _process) = started(dir.path(), &plugin).await?;
    let admitted = manager
        .admit_pod(
            &pod("p"),
            &[
                container_request("init", ContainerKind::Init, 1),
                container_request("app", ContainerKind::App, 2),
            ],
        )
        .await?;
    // init: the plugin prefers the last one, d3.
    assert_eq!(granted(&admitted["init"].envs, "example.com/dev"), ["d3"]);
    let record = plugin.record();
    let asked = &record.preferred_requests[1];
    assert_eq!(asked.must_include_device_i_ds, ["d3"]);
    assert_eq!(asked.available_device_i_ds, ["d0", "d1", "d2", "d3"]);
    assert_eq!(asked.allocation_size, 2);
    // LastN answers [d2, d3]: valid, d3 included.
    assert_eq!(record.allocations[1], ["d2", "d3"]);
    Ok(())
}
