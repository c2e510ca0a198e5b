//! A private containerd 1.7 driven through its CRI gRPC API, the way kubelet
//! drives it: pod sandboxes with a chosen pid namespace mode, containers with
//! CDI devices, annotations and envs, verbose container status, `ExecSync`.
//!
//! The daemon itself — its config, start, image import and teardown — is
//! the simulated cluster's product code (`tessera_kube_cluster::containerd`,
//! which `tessera-sim cluster up` runs one per node); this module adds what
//! tests need on top: a scratch directory below [`SCRATCH_BASE`], a cgroup
//! parent per daemon, a CRI client, pods and containers that go away on drop.
//! Dropping a [`Containerd`] takes everything down: pods, containers, shims,
//! the daemon and any mount left under its directory.
//!
//! Images: one busybox image ([`IMAGE`], `tessera_kube_cluster::image`),
//! built once per machine under `SCRATCH_BASE/images` and imported into each
//! daemon. It is also the sandbox ("pause") image: its default command is `sleep`.

use std::collections::HashMap;
use std::fmt;
use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use serde_json::Value;
use tonic::transport::Channel;

use crate::prereq::Need;
use crate::rootfs::{SCRATCH_BASE, scratch_dir};
use tessera_kube_cluster::containerd::{Daemon, remove_cgroups};

/// The CRI API subset (package `runtime.v1`), the one the kubelet stand-in
/// speaks too (`sim/kube/proto/proto/cri-api-v1-subset.proto`).
pub use tessera_kube_proto::cri;

use cri::runtime_service_client::RuntimeServiceClient;

/// The daemon's paths and config, the image, the binaries and runtime
/// handler: one place, the cluster's product code.
pub use tessera_kube_cluster::containerd::{
    DEFAULT_BIN_DIR, DaemonDirs, K8S_NAMESPACE, Options, RUNC, RUNTIME_HANDLER,
};
pub use tessera_kube_cluster::image::{IMAGE, ImageArchive};

/// The top cgroup below which every daemon's pods get theirs.
pub const CGROUP_ROOT: &str = "tessera-e2e";

/// How long one CRI call may take before the test gives up on it.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// The directory holding containerd 1.7's binaries:
/// `$TESSERA_CONTAINERD_BIN_DIR` or [`DEFAULT_BIN_DIR`].
pub fn bin_dir() -> PathBuf {
    tessera_kube_cluster::containerd::bin_dir_from_env()
}

/// What the containerd runner needs: root, runc, podman and tar (to build
/// the image), and containerd 1.7 under [`bin_dir`] — for [`crate::require`].
pub fn needs() -> Vec<Need> {
    let dir = bin_dir();
    let mut needs = vec![
        Need::Root,
        Need::Program("runc"),
        Need::Program("podman"),
        Need::Program("tar"),
    ];
    needs.extend(tessera_kube_cluster::containerd::BINARIES.map(|b| {
        Need::File {
            path: dir.join(b),
            fix: "containerd 1.7: run scripts/lib.sh's tessera_install_containerd, \
              or set TESSERA_CONTAINERD_BIN_DIR"
                .to_owned(),
        }
    }));
    needs.push(Need::File {
        path: PathBuf::from(RUNC),
        fix: "install: apt-get install runc".to_owned(),
    });
    needs
}

/// A CRI pid namespace mode, as kubelet chooses it for a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PidMode {
    /// Each container has its own pid namespace (the Kubernetes default).
    Container,
    /// The pod's containers share one (`shareProcessNamespace: true`).
    Pod,
    /// The host's pid namespace (`hostPID: true`).
    Node,
}

impl PidMode {
    /// All three, in the order tests run them.
    pub const ALL: [PidMode; 3] = [PidMode::Container, PidMode::Pod, PidMode::Node];

    /// The CRI enum value.
    pub fn cri(self) -> cri::NamespaceMode {
        match self {
            PidMode::Container => cri::NamespaceMode::Container,
            PidMode::Pod => cri::NamespaceMode::Pod,
            PidMode::Node => cri::NamespaceMode::Node,
        }
    }
}

impl fmt::Display for PidMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PidMode::Container => "CONTAINER",
            PidMode::Pod => "POD",
            PidMode::Node => "NODE",
        })
    }
}

/// The busybox image as an OCI archive, built once per machine under
/// `SCRATCH_BASE/images` (keyed by the busybox binary and the build recipe).
pub fn busybox_image_archive() -> Result<ImageArchive> {
    Ok(tessera_kube_cluster::image::busybox_archive(
        &Path::new(SCRATCH_BASE).join("images"),
    )?)
}

/// A busybox image with more in it ([`tessera_kube_cluster::image::busybox_archive_with`]),
/// built once per machine under `SCRATCH_BASE/images`, for
/// [`Containerd::import_image_as`].
pub fn busybox_image_archive_with(
    kind: &str,
    key_parts: &[&[u8]],
    populate: impl FnOnce(&Path) -> std::io::Result<()>,
) -> Result<ImageArchive> {
    Ok(tessera_kube_cluster::image::busybox_archive_with(
        &Path::new(SCRATCH_BASE).join("images"),
        kind,
        key_parts,
        populate,
    )?)
}

/// The cgroup (cgroupfs path) every pod of the daemon in `base` goes below,
/// as kubelet's `/kubepods/...`; removed with the daemon.
fn cgroup_parent(base: &Path) -> String {
    format!(
        "/{CGROUP_ROOT}/{}",
        base.file_name().map_or_else(
            || "containerd".to_owned(),
            |n| n.to_string_lossy().into_owned()
        )
    )
}

/// A private containerd daemon with a CRI client; taken down on drop.
pub struct Containerd {
    dirs: DaemonDirs,
    options: Options,
    /// Where pods' container logs go.
    logs: PathBuf,
    cgroup_parent: String,
    daemon: Option<Daemon>,
    rt: tokio::runtime::Runtime,
    client: RuntimeServiceClient<Channel>,
    version: cri::VersionResponse,
    pods: Mutex<Vec<String>>,
    // Last: removed after everything above is down.
    _scratch: tempfile::TempDir,
}

impl fmt::Debug for Containerd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Containerd")
            .field("dirs", &self.dirs)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Containerd {
    /// Starts a daemon configured by `options`, waits until its socket answers
    /// a CRI `Version` call, and imports the busybox image.
    pub fn start(options: Options) -> Result<Self> {
        let archive = busybox_image_archive().context("building the busybox image")?;
        let scratch = scratch_dir("containerd")?;
        let dirs = DaemonDirs::new(scratch.path());
        let logs = scratch.path().join("pods");
        fs::create_dir_all(&logs)?;
        let daemon = Daemon::start(&bin_dir(), dirs.clone(), &options, Duration::from_secs(30))?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        // A failure from here on still takes the daemon down (its Drop).
        let (client, version) = Self::connect(&rt, &dirs.socket).with_context(|| {
            format!(
                "containerd log ({}):\n{}",
                dirs.log().display(),
                tessera_kube_cluster::containerd::tail(&dirs.log(), 30)
            )
        })?;
        daemon
            .import_image(&archive)
            .context("importing the busybox image")?;
        Ok(Self {
            cgroup_parent: cgroup_parent(&dirs.base),
            dirs,
            options,
            logs,
            daemon: Some(daemon),
            rt,
            client,
            version,
            pods: Mutex::new(Vec::new()),
            _scratch: scratch,
        })
    }

    fn connect(
        rt: &tokio::runtime::Runtime,
        socket: &Path,
    ) -> Result<(RuntimeServiceClient<Channel>, cri::VersionResponse)> {
        // The daemon already answers `ctr version`; its CRI plugin may still
        // be loading.
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut last = anyhow!("no answer");
        while Instant::now() < deadline {
            match rt.block_on(Self::try_version(socket)) {
                Ok(ok) => return Ok(ok),
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(last.context("containerd's CRI did not answer Version within 30 s"))
    }

    async fn try_version(
        socket: &Path,
    ) -> Result<(RuntimeServiceClient<Channel>, cri::VersionResponse)> {
        let channel = tessera_kube_proto::unix_channel(socket).await?;
        let mut client = RuntimeServiceClient::new(channel);
        let version = tokio::time::timeout(
            Duration::from_secs(5),
            client.version(cri::VersionRequest {
                version: "v1".to_owned(),
            }),
        )
        .await
        .context("Version timed out")??
        .into_inner();
        Ok((client, version))
    }

    /// What the daemon answered to `Version` (runtime name and version).
    pub fn version(&self) -> &cri::VersionResponse {
        &self.version
    }

    /// Imports an image archive (one of `tessera_kube_cluster::image`'s)
    /// and tags the image `name`, for [`ContainerSpec::image`].
    pub fn import_image_as(&self, archive: &ImageArchive, name: &str) -> Result<()> {
        self.daemon
            .as_ref()
            .context("the daemon is down")?
            .import_image_as(archive, name)
            .with_context(|| format!("importing {} as {name}", archive.path.display()))
    }

    /// The daemon's directories.
    pub fn dirs(&self) -> &DaemonDirs {
        &self.dirs
    }

    /// The options it was started with.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// The last `lines` lines of the daemon's log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        tessera_kube_cluster::containerd::tail(&self.dirs.log(), lines)
    }

    /// Runs one CRI call with the client, bounded by a timeout.
    fn call<T, F, Fut>(&self, what: &str, f: F) -> Result<T>
    where
        F: FnOnce(RuntimeServiceClient<Channel>) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        let client = self.client.clone();
        self.rt.block_on(async {
            match tokio::time::timeout(CALL_TIMEOUT, f(client)).await {
                Err(_) => bail!("CRI {what}: no answer within {CALL_TIMEOUT:?}"),
                Ok(Err(status)) => bail!("CRI {what}: {} ({:?})", status.message(), status.code()),
                Ok(Ok(response)) => Ok(response.into_inner()),
            }
        })
    }

    /// Runs a pod sandbox on the host network with pid namespace mode `pid`
    /// (a kubelet `RunPodSandbox`); the pod is stopped and removed when the
    /// returned [`Pod`] is dropped.
    pub fn run_pod(&self, name: &str, pid: PidMode) -> Result<Pod<'_>> {
        self.run_pod_with(name, pid, &[])
    }

    /// [`Containerd::run_pod`] with pod annotations.
    pub fn run_pod_with(
        &self,
        name: &str,
        pid: PidMode,
        annotations: &[(&str, &str)],
    ) -> Result<Pod<'_>> {
        let uid = format!("{name}-{}", std::process::id());
        let log_directory = self.logs.join(&uid);
        fs::create_dir_all(&log_directory)?;
        let namespaces = cri::NamespaceOption {
            network: cri::NamespaceMode::Node.into(),
            pid: pid.cri().into(),
            ipc: cri::NamespaceMode::Pod.into(),
            target_id: String::new(),
        };
        let config = cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: name.to_owned(),
                uid: uid.clone(),
                namespace: "tessera-e2e".to_owned(),
                attempt: 0,
            }),
            hostname: String::new(),
            log_directory: log_directory.display().to_string(),
            labels: HashMap::new(),
            annotations: annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            linux: Some(cri::LinuxPodSandboxConfig {
                cgroup_parent: format!("{}/pod{uid}", self.cgroup_parent),
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(namespaces.clone()),
                    readonly_rootfs: false,
                    privileged: false,
                }),
                sysctls: HashMap::new(),
            }),
        };
        let request = cri::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: RUNTIME_HANDLER.to_owned(),
        };
        let id = self
            .call("RunPodSandbox", |mut c| async move {
                c.run_pod_sandbox(request).await
            })
            .with_context(|| format!("RunPodSandbox {name} (pid {pid})"))?
            .pod_sandbox_id;
        self.pods
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(id.clone());
        Ok(Pod {
            daemon: self,
            id,
            config,
            namespaces,
            pid,
            containers: Mutex::new(Vec::new()),
            gone: false,
        })
    }

    /// Stops and removes a pod sandbox (and with it its containers).
    fn remove_pod(&self, id: &str) -> Result<()> {
        let stop = cri::StopPodSandboxRequest {
            pod_sandbox_id: id.to_owned(),
        };
        self.call("StopPodSandbox", |mut c| async move {
            c.stop_pod_sandbox(stop).await
        })?;
        let remove = cri::RemovePodSandboxRequest {
            pod_sandbox_id: id.to_owned(),
        };
        self.call("RemovePodSandbox", |mut c| async move {
            c.remove_pod_sandbox(remove).await
        })?;
        self.pods
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|p| p != id);
        Ok(())
    }

    /// Starts a created container.
    pub fn start_container(&self, id: &str) -> Result<()> {
        let request = cri::StartContainerRequest {
            container_id: id.to_owned(),
        };
        self.call("StartContainer", |mut c| async move {
            c.start_container(request).await
        })?;
        Ok(())
    }

    /// Stops a container: SIGTERM, then SIGKILL after `timeout` seconds (0:
    /// SIGKILL at once).
    pub fn stop_container(&self, id: &str, timeout: i64) -> Result<()> {
        let request = cri::StopContainerRequest {
            container_id: id.to_owned(),
            timeout,
        };
        self.call("StopContainer", |mut c| async move {
            c.stop_container(request).await
        })?;
        Ok(())
    }

    /// Removes a stopped container.
    pub fn remove_container(&self, id: &str) -> Result<()> {
        let request = cri::RemoveContainerRequest {
            container_id: id.to_owned(),
        };
        self.call("RemoveContainer", |mut c| async move {
            c.remove_container(request).await
        })?;
        Ok(())
    }

    /// `ContainerStatus` with `verbose = true`: the status and containerd's
    /// info JSON (the init's host pid, the OCI runtime spec, …).
    pub fn container_status(&self, id: &str) -> Result<ContainerInfo> {
        let request = cri::ContainerStatusRequest {
            container_id: id.to_owned(),
            verbose: true,
        };
        let response = self.call("ContainerStatus", |mut c| async move {
            c.container_status(request).await
        })?;
        let status = response
            .status
            .context("ContainerStatus answered without a status")?;
        let info = match response.info.get("info") {
            Some(text) => serde_json::from_str(text).context("ContainerStatus info JSON")?,
            None => Value::Null,
        };
        Ok(ContainerInfo { status, info })
    }

    /// Runs `cmd` in a running container (`ExecSync`), with a timeout in seconds.
    pub fn exec_sync(&self, id: &str, cmd: &[&str], timeout: i64) -> Result<ExecOutput> {
        let request = cri::ExecSyncRequest {
            container_id: id.to_owned(),
            cmd: cmd.iter().map(|s| (*s).to_owned()).collect(),
            timeout,
        };
        let response = self.call(
            "ExecSync",
            |mut c| async move { c.exec_sync(request).await },
        )?;
        Ok(ExecOutput {
            stdout: String::from_utf8_lossy(&response.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&response.stderr).into_owned(),
            exit_code: response.exit_code,
        })
    }

    /// Takes everything down: pods through CRI, then whatever runc still
    /// knows of, shims and their children, the daemon, and mounts left below
    /// the scratch directory. Best effort; what failed is printed.
    fn shut_down(&mut self) {
        let pods: Vec<String> = self.pods.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for pod in pods {
            if let Err(e) = self.remove_pod(&pod) {
                eprintln!("containerd teardown: pod {pod}: {e:#}");
            }
        }
        if let Some(mut daemon) = self.daemon.take() {
            daemon.shut_down();
        }
        remove_cgroups(&self.cgroup_parent);
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// A container to create in a pod.
#[derive(Debug, Clone, Default)]
pub struct ContainerSpec {
    /// The container's name in the pod.
    pub name: String,
    /// Its command (argv); the image's default when empty.
    pub command: Vec<String>,
    /// Environment variables.
    pub envs: Vec<(String, String)>,
    /// Container annotations.
    pub annotations: Vec<(String, String)>,
    /// Fully qualified CDI device names (`vendor/class=name`), sent in the
    /// CRI `CDI_devices` field.
    pub cdi_devices: Vec<String>,
    /// The image; `None`: [`IMAGE`] (busybox). Another one must have been
    /// imported with [`Containerd::import_image_as`].
    pub image: Option<String>,
}

impl ContainerSpec {
    /// A container named `name` running `command`.
    pub fn new(name: &str, command: &[&str]) -> Self {
        Self {
            name: name.to_owned(),
            command: command.iter().map(|s| (*s).to_owned()).collect(),
            ..Self::default()
        }
    }

    /// Adds a CDI device.
    pub fn cdi_device(mut self, name: &str) -> Self {
        self.cdi_devices.push(name.to_owned());
        self
    }

    /// Runs the container from `image` (imported with
    /// [`Containerd::import_image_as`]).
    pub fn image(mut self, image: &str) -> Self {
        self.image = Some(image.to_owned());
        self
    }

    /// Adds an annotation.
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.annotations.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Adds an environment variable.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.envs.push((key.to_owned(), value.to_owned()));
        self
    }
}

/// A running pod sandbox; stopped and removed (with its containers) on drop.
pub struct Pod<'d> {
    daemon: &'d Containerd,
    id: String,
    config: cri::PodSandboxConfig,
    namespaces: cri::NamespaceOption,
    pid: PidMode,
    containers: Mutex<Vec<String>>,
    gone: bool,
}

impl fmt::Debug for Pod<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pod")
            .field("id", &self.id)
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

impl Pod<'_> {
    /// The sandbox id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Its pid namespace mode.
    pub fn pid_mode(&self) -> PidMode {
        self.pid
    }

    /// Creates a container (kubelet's `CreateContainer`: the pod's namespace
    /// options repeated in the container's security context), returning its id.
    pub fn create_container(&self, spec: &ContainerSpec) -> Result<String> {
        let log_path = format!("{}.log", spec.name);
        let config = cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: spec.name.clone(),
                attempt: 0,
            }),
            image: Some(cri::ImageSpec {
                image: spec.image.clone().unwrap_or_else(|| IMAGE.to_owned()),
                ..cri::ImageSpec::default()
            }),
            command: spec.command.clone(),
            args: Vec::new(),
            working_dir: String::new(),
            envs: spec
                .envs
                .iter()
                .map(|(key, value)| cri::KeyValue {
                    key: key.clone(),
                    value: value.clone(),
                })
                .collect(),
            mounts: Vec::new(),
            devices: Vec::new(),
            labels: HashMap::new(),
            annotations: spec.annotations.iter().cloned().collect(),
            log_path,
            linux: Some(cri::LinuxContainerConfig {
                security_context: Some(cri::LinuxContainerSecurityContext {
                    privileged: false,
                    namespace_options: Some(self.namespaces.clone()),
                    readonly_rootfs: false,
                    no_new_privs: false,
                }),
            }),
            cdi_devices: spec
                .cdi_devices
                .iter()
                .map(|name| cri::CdiDevice { name: name.clone() })
                .collect(),
        };
        let request = cri::CreateContainerRequest {
            pod_sandbox_id: self.id.clone(),
            config: Some(config),
            sandbox_config: Some(self.config.clone()),
        };
        let id = self
            .daemon
            .call("CreateContainer", |mut c| async move {
                c.create_container(request).await
            })
            .with_context(|| format!("CreateContainer {}", spec.name))?
            .container_id;
        self.containers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(id.clone());
        Ok(id)
    }

    /// Creates and starts a container, returning its id.
    pub fn run_container(&self, spec: &ContainerSpec) -> Result<String> {
        let id = self.create_container(spec)?;
        self.daemon
            .start_container(&id)
            .with_context(|| format!("StartContainer {} ({id})", spec.name))?;
        Ok(id)
    }

    /// Stops (SIGKILL) and removes one of the pod's containers.
    pub fn stop_and_remove_container(&self, id: &str) -> Result<()> {
        self.daemon.stop_container(id, 0)?;
        self.daemon.remove_container(id)?;
        self.containers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|c| c != id);
        Ok(())
    }

    /// The log file of a container of this pod (what it wrote to stdout/stderr).
    pub fn container_log(&self, name: &str) -> String {
        fs::read_to_string(Path::new(&self.config.log_directory).join(format!("{name}.log")))
            .unwrap_or_default()
    }

    /// Stops and removes the remaining containers, then the sandbox.
    pub fn remove(mut self) -> Result<()> {
        self.gone = true;
        self.tear_down()
    }

    fn tear_down(&self) -> Result<()> {
        let containers: Vec<String> = self
            .containers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut problems = Vec::new();
        for id in containers {
            if let Err(e) = self.stop_and_remove_container(&id) {
                problems.push(format!("container {id}: {e:#}"));
            }
        }
        if let Err(e) = self.daemon.remove_pod(&self.id) {
            problems.push(format!("pod {}: {e:#}", self.id));
        }
        ensure!(problems.is_empty(), "{}", problems.join("\n"));
        Ok(())
    }
}

impl Drop for Pod<'_> {
    fn drop(&mut self) {
        if !self.gone
            && let Err(e) = self.tear_down()
        {
            eprintln!("pod teardown: {e:#}");
        }
    }
}

/// A verbose `ContainerStatus` answer.
#[derive(Debug, Clone)]
pub struct ContainerInfo {
    /// The CRI status.
    pub status: cri::ContainerStatus,
    /// containerd's info JSON (`pid`, `runtimeSpec`, `snapshotKey`, …).
    pub info: Value,
}

impl ContainerInfo {
    /// The container init's pid in the host's pid namespace.
    pub fn host_pid(&self) -> Result<u32> {
        let pid = self.info["pid"]
            .as_u64()
            .with_context(|| format!("no pid in the status info: {}", self.info))?;
        ensure!(pid > 0, "the status info gives pid 0 (not running?)");
        Ok(u32::try_from(pid)?)
    }

    /// The OCI runtime spec containerd gave runc.
    pub fn runtime_spec(&self) -> &Value {
        &self.info["runtimeSpec"]
    }

    /// Whether the container is running.
    pub fn running(&self) -> bool {
        self.status.state == i32::from(cri::ContainerState::ContainerRunning)
    }
}

/// What `ExecSync` returned.
#[derive(Debug, Clone)]
pub struct ExecOutput {
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
    /// Exit status.
    pub exit_code: i32,
}

/// Writes `value` as pretty JSON to `path` (mode 0644).
pub fn write_json(path: &Path, value: &Value) -> Result<()> {
    let mut file = fs::File::create(path)?;
    file.write_all(&serde_json::to_vec_pretty(value)?)?;
    file.write_all(b"\n")?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o644))?;
    Ok(())
}
