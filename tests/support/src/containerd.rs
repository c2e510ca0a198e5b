//! A private containerd 1.7 driven through its CRI gRPC API, the way kubelet
//! drives it: pod sandboxes with a chosen pid namespace mode, containers with
//! CDI devices, annotations and envs, verbose container status, `ExecSync`.
//!
//! The daemon is containerd 1.7 from Debian trixie, unpacked beside bookworm's
//! packages by `scripts/lib.sh` (`tessera_install_containerd`) under
//! [`DEFAULT_BIN_DIR`] (or `$TESSERA_CONTAINERD_BIN_DIR`), and runs
//! containers with bookworm's runc ([`RUNC`]). Each [`Containerd`] has its own
//! root, state, runc root and socket in a scratch directory below
//! [`SCRATCH_BASE`], never the system's `/run/containerd`, and takes
//! everything down when dropped: pods, containers, shims, the daemon and any
//! mount left under its directory.
//!
//! Images: one busybox image ([`IMAGE`]), built once per machine with podman
//! (`import` of a busybox-static rootfs, `save --format oci-archive`) and
//! imported into each daemon with `ctr images import --snapshotter native`.
//! It is also the sandbox ("pause") image: its default command is `sleep`.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::prereq::Need;
use crate::rootfs::{SCRATCH_BASE, busybox_rootfs, mounts_under, scratch_dir};
use crate::run;

/// The CRI API subset (package `runtime.v1`), the one the kubelet stand-in
/// speaks too (`sim/kube/proto/proto/cri-api-v1-subset.proto`).
pub use tessera_kube_proto::cri;

use cri::runtime_service_client::RuntimeServiceClient;

/// Where `tessera_install_containerd` (scripts/lib.sh) unpacks containerd 1.7's
/// binaries (`containerd`, `containerd-shim-runc-v2`, `ctr`).
pub const DEFAULT_BIN_DIR: &str = "/opt/tessera-e2e/containerd-1.7/usr/bin";

/// The OCI runtime the daemon's runc handler uses: bookworm's runc 1.1.5
/// (trixie's needs a newer glibc).
pub const RUNC: &str = "/usr/sbin/runc";

/// The busybox image every pod and container of the tests runs.
pub const IMAGE: &str = "localhost/tessera-e2e/busybox:latest";

/// The CRI runtime handler the daemon configures (runc, `io.containerd.runc.v2`).
pub const RUNTIME_HANDLER: &str = "runc";

/// The top cgroup below which every daemon's pods get theirs.
pub const CGROUP_ROOT: &str = "tessera-e2e";

/// The containerd namespace of the CRI plugin.
pub const K8S_NAMESPACE: &str = "k8s.io";

/// How long one CRI call may take before the test gives up on it.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// The directory holding containerd 1.7's binaries:
/// `$TESSERA_CONTAINERD_BIN_DIR` or [`DEFAULT_BIN_DIR`].
pub fn bin_dir() -> PathBuf {
    std::env::var_os("TESSERA_CONTAINERD_BIN_DIR")
        .map_or_else(|| PathBuf::from(DEFAULT_BIN_DIR), PathBuf::from)
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
    needs.extend(["containerd", "containerd-shim-runc-v2", "ctr"].map(|b| {
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

/// How the daemon's CRI plugin is configured.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// `enable_cdi`: containerd resolves CDI devices itself.
    pub enable_cdi: bool,
    /// `cdi_spec_dirs`: where it looks for CDI specs.
    pub cdi_spec_dirs: Vec<PathBuf>,
    /// The runc handler's `base_runtime_spec`: the whole starting OCI spec.
    pub base_runtime_spec: Option<PathBuf>,
    /// The runc handler's `container_annotations`: container annotations
    /// (prefixes) passed into the OCI spec.
    pub container_annotations: Vec<String>,
    /// The runc handler's `pod_annotations`: pod annotations (prefixes)
    /// passed into the OCI spec.
    pub pod_annotations: Vec<String>,
}

/// A TOML basic string.
fn toml_str(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

fn toml_list<S: AsRef<str>>(items: &[S]) -> String {
    let items: Vec<String> = items.iter().map(|s| toml_str(s.as_ref())).collect();
    format!("[{}]", items.join(", "))
}

impl Options {
    /// The daemon's config file (version 2) for a daemon living in `dir`.
    pub fn config_toml(&self, dir: &DaemonDirs) -> String {
        let cdi_dirs: Vec<String> = self
            .cdi_spec_dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect();
        let base_spec = self
            .base_runtime_spec
            .as_ref()
            .map(|p| {
                format!(
                    "      base_runtime_spec = {}\n",
                    toml_str(&p.display().to_string())
                )
            })
            .unwrap_or_default();
        let cri = r#"plugins."io.containerd.grpc.v1.cri""#;
        format!(
            r#"# Written by tessera-e2e (tests/src/containerd.rs): a private containerd for one test.
version = 2
root = {root}
state = {state}
# Plugins that would touch host-wide places or cannot work here.
disabled_plugins = [
  "io.containerd.internal.v1.opt",
  "io.containerd.internal.v1.tracing",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
]

[grpc]
  address = {socket}

[ttrpc]
  address = {ttrpc}

[debug]
  level = "info"

[{cri}]
  sandbox_image = {image}
  # This machine forbids lowering oom_score_adj; without this runc fails with
  # "can't get final child's PID from pipe".
  restrict_oom_score_adj = true
  enable_cdi = {enable_cdi}
  cdi_spec_dirs = {cdi_dirs}
  [{cri}.containerd]
    snapshotter = "native"
    default_runtime_name = {handler}
    [{cri}.containerd.runtimes.{handler_key}]
      runtime_type = "io.containerd.runc.v2"
{base_spec}      container_annotations = {container_annotations}
      pod_annotations = {pod_annotations}
      [{cri}.containerd.runtimes.{handler_key}.options]
        BinaryName = {runc}
        Root = {runc_root}
  [{cri}.cni]
    bin_dir = {cni_bin}
    conf_dir = {cni_conf}
"#,
            root = toml_str(&dir.root.display().to_string()),
            state = toml_str(&dir.state.display().to_string()),
            socket = toml_str(&dir.socket.display().to_string()),
            ttrpc = toml_str(&format!("{}.ttrpc", dir.socket.display())),
            image = toml_str(IMAGE),
            enable_cdi = self.enable_cdi,
            cdi_dirs = toml_list(&cdi_dirs),
            handler = toml_str(RUNTIME_HANDLER),
            handler_key = RUNTIME_HANDLER,
            container_annotations = toml_list(&self.container_annotations),
            pod_annotations = toml_list(&self.pod_annotations),
            runc = toml_str(RUNC),
            runc_root = toml_str(&dir.runc_root.display().to_string()),
            cni_bin = toml_str(&dir.base.join("cni/bin").display().to_string()),
            cni_conf = toml_str(&dir.base.join("cni/net.d").display().to_string()),
        )
    }
}

/// The places one daemon owns, all below its scratch directory.
#[derive(Debug, Clone)]
pub struct DaemonDirs {
    /// The scratch directory.
    pub base: PathBuf,
    /// containerd's `root` (content, snapshots, CRI's sandbox files).
    pub root: PathBuf,
    /// containerd's `state` (task bundles, the containers' rootfs mounts).
    pub state: PathBuf,
    /// The runc handler's runc `--root` (the shim adds the namespace).
    pub runc_root: PathBuf,
    /// The gRPC socket.
    pub socket: PathBuf,
    /// Where pods' container logs go.
    pub logs: PathBuf,
    /// The cgroup (cgroupfs path) every pod of the daemon goes below, as
    /// kubelet's `/kubepods/...`; removed with the daemon.
    pub cgroup_parent: String,
}

impl DaemonDirs {
    fn new(base: &Path) -> Self {
        Self {
            base: base.to_owned(),
            root: base.join("root"),
            state: base.join("state"),
            runc_root: base.join("runc"),
            socket: base.join("containerd.sock"),
            logs: base.join("pods"),
            cgroup_parent: format!(
                "/{CGROUP_ROOT}/{}",
                base.file_name().map_or_else(
                    || "containerd".to_owned(),
                    |n| n.to_string_lossy().into_owned()
                )
            ),
        }
    }

    /// The task bundle of a container (its `config.json`, and its rootfs
    /// mounted at `rootfs/` in the host's mount namespace).
    pub fn bundle(&self, container_id: &str) -> PathBuf {
        self.state
            .join("io.containerd.runtime.v2.task")
            .join(K8S_NAMESPACE)
            .join(container_id)
    }
}

/// Serializes podman image builds between test processes.
static IMAGE_BUILD: Mutex<()> = Mutex::new(());

/// An OCI archive of the busybox image and the name it holds the image under.
#[derive(Debug, Clone)]
pub struct ImageArchive {
    /// The `oci-archive` file.
    pub path: PathBuf,
    /// The image's name in it (a build tag; daemons tag it [`IMAGE`]).
    pub name: String,
}

/// The busybox image as an OCI archive, built once per machine under
/// `SCRATCH_BASE/images` (keyed by the busybox binary and the build recipe).
pub fn busybox_image_archive() -> Result<ImageArchive> {
    let _guard = IMAGE_BUILD.lock().unwrap_or_else(|e| e.into_inner());
    let images = Path::new(SCRATCH_BASE).join("images");
    fs::create_dir_all(&images)?;
    let lock = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(images.join(".lock"))?;
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
        .context("flock the image directory")?;

    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .context("busybox-static is not installed (apt-get install busybox-static)")?;
    const RECIPE: &str = "v1: busybox_rootfs + dev proc sys etc tmp; CMD sleep infinity";
    let key = fs::read(busybox)?
        .iter()
        .chain(RECIPE.as_bytes())
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
    // A tag of its own, so a build never clobbers an image someone else uses.
    let tag = format!("localhost/tessera-e2e/busybox-build:{key:016x}");
    let archive = ImageArchive {
        path: images.join(format!("busybox-{key:016x}.oci.tar")),
        name: tag.clone(),
    };
    if archive.path.exists() {
        return Ok(archive);
    }

    let work = scratch_dir("image")?;
    let rootfs = busybox_rootfs(work.path())?;
    for dir in ["dev", "proc", "sys", "etc", "tmp", "run"] {
        fs::create_dir_all(rootfs.join(dir))?;
    }
    fs::set_permissions(rootfs.join("tmp"), fs::Permissions::from_mode(0o1777))?;
    let tar = work.path().join("rootfs.tar");
    run(Command::new("tar")
        .arg("-C")
        .arg(&rootfs)
        .arg("--numeric-owner")
        .arg("-cf")
        .arg(&tar)
        .arg("."))?;
    run(Command::new("podman")
        .args([
            "import",
            "-q",
            "--change",
            r#"CMD ["/bin/sleep", "infinity"]"#,
        ])
        .arg(&tar)
        .arg(&tag))?;
    let tmp = images.join(format!(".busybox-{key:016x}.{}.tmp", std::process::id()));
    let _ = fs::remove_file(&tmp);
    let saved = run(Command::new("podman")
        .args(["save", "-q", "--format", "oci-archive", "-o"])
        .arg(&tmp)
        .arg(&tag));
    let _ = Command::new("podman")
        .args(["rmi", "-f", &tag])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    saved?;
    fs::rename(&tmp, &archive.path)?;
    Ok(archive)
}

/// A private containerd daemon with a CRI client; taken down on drop.
pub struct Containerd {
    dirs: DaemonDirs,
    options: Options,
    child: Option<Child>,
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
        for d in [&dirs.root, &dirs.state, &dirs.runc_root, &dirs.logs] {
            fs::create_dir_all(d)?;
        }
        let config = dirs.base.join("config.toml");
        fs::write(&config, options.config_toml(&dirs))?;
        let log = fs::File::create(dirs.base.join("containerd.log"))?;
        let bin = bin_dir();
        let path = format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", bin.display());
        let mut cmd = Command::new(bin.join("containerd"));
        cmd.arg("--config")
            .arg(&config)
            .env_clear()
            .env("PATH", &path)
            .env("TMPDIR", dirs.base.join("tmp"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        fs::create_dir_all(dirs.base.join("tmp"))?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.join("containerd").display()))?;
        // From here on a failure still takes the daemon down: build a
        // partial value whose Drop does that.
        let mut daemon = Partial {
            dirs: dirs.clone(),
            child: Some(child),
        };
        let (client, version) = match Self::connect(&rt, &dirs.socket, &mut daemon) {
            Ok(c) => c,
            Err(e) => {
                let log = daemon.log_tail();
                return Err(e.context(log));
            }
        };
        let child = daemon.child.take();
        let this = Self {
            dirs,
            options,
            child,
            rt,
            client,
            version,
            pods: Mutex::new(Vec::new()),
            _scratch: scratch,
        };
        this.import_image(&archive)?;
        Ok(this)
    }

    fn connect(
        rt: &tokio::runtime::Runtime,
        socket: &Path,
        daemon: &mut Partial,
    ) -> Result<(RuntimeServiceClient<Channel>, cri::VersionResponse)> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut last = anyhow!("containerd did not create its socket");
        while Instant::now() < deadline {
            if let Some(child) = daemon.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                bail!("containerd exited with {status} while starting");
            }
            if socket.exists() {
                match rt.block_on(Self::try_version(socket)) {
                    Ok(ok) => return Ok(ok),
                    Err(e) => last = e,
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(last.context("containerd's CRI did not answer Version within 30 s"))
    }

    async fn try_version(
        socket: &Path,
    ) -> Result<(RuntimeServiceClient<Channel>, cri::VersionResponse)> {
        let socket = socket.to_owned();
        let channel = Endpoint::try_from("http://[::]:50051")?
            .connect_timeout(Duration::from_secs(5))
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let socket = socket.clone();
                async move {
                    Ok::<_, std::io::Error>(TokioIo::new(
                        tokio::net::UnixStream::connect(socket).await?,
                    ))
                }
            }))
            .await?;
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

    /// Imports the image archive and tags the image [`IMAGE`].
    fn import_image(&self, archive: &ImageArchive) -> Result<()> {
        run(Command::new(bin_dir().join("ctr"))
            .arg("--address")
            .arg(&self.dirs.socket)
            .args([
                "-n",
                K8S_NAMESPACE,
                "images",
                "import",
                "--snapshotter",
                "native",
            ])
            .arg(&archive.path))
        .context("importing the busybox image")?;
        run(Command::new(bin_dir().join("ctr"))
            .arg("--address")
            .arg(&self.dirs.socket)
            .args([
                "-n",
                K8S_NAMESPACE,
                "images",
                "tag",
                "--force",
                &archive.name,
                IMAGE,
            ]))
        .context("tagging the busybox image")?;
        Ok(())
    }

    /// What the daemon answered to `Version` (runtime name and version).
    pub fn version(&self) -> &cri::VersionResponse {
        &self.version
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
        tail(&self.dirs.base.join("containerd.log"), lines)
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
        let log_directory = self.dirs.logs.join(&uid);
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
                cgroup_parent: format!("{}/pod{uid}", self.dirs.cgroup_parent),
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
        let mut partial = Partial {
            dirs: self.dirs.clone(),
            child: self.child.take(),
        };
        partial.shut_down();
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// A daemon being started or taken down: enough to kill it and clean up.
struct Partial {
    dirs: DaemonDirs,
    child: Option<Child>,
}

impl Partial {
    fn log_tail(&self) -> String {
        format!(
            "containerd log ({}):\n{}",
            self.dirs.base.join("containerd.log").display(),
            tail(&self.dirs.base.join("containerd.log"), 30)
        )
    }

    fn shut_down(&mut self) {
        // Containers runc still knows of: `delete --force` kills their
        // processes and removes their cgroups.
        let runc_root = self.dirs.runc_root.join(K8S_NAMESPACE);
        if let Ok(entries) = fs::read_dir(&runc_root) {
            for entry in entries.flatten() {
                let id = entry.file_name();
                let _ = Command::new(RUNC)
                    .arg("--root")
                    .arg(&runc_root)
                    .args(["delete", "--force"])
                    .arg(&id)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
        }
        // Shims (their command line names this daemon's socket) and
        // everything below them.
        let socket = self.dirs.socket.display().to_string();
        let shims = processes_whose_cmdline_has(&socket);
        let doomed = with_descendants(&shims);
        let shim_sockets = sockets_of(&shims, SHIM_SOCKET_DIR);
        // The daemon: SIGTERM, then SIGKILL.
        if let Some(mut child) = self.child.take() {
            if let Ok(pid) = i32::try_from(child.id()) {
                signal(pid, rustix::process::Signal::TERM);
            }
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        for pid in doomed.iter().rev() {
            signal(*pid, rustix::process::Signal::KILL);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline
            && doomed
                .iter()
                .any(|p| Path::new(&format!("/proc/{p}")).exists())
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        // A shim removes its socket when it exits, not when it is killed.
        for socket in shim_sockets {
            let _ = fs::remove_file(socket);
        }
        remove_cgroups(&self.dirs.cgroup_parent);
        // Mounts below the scratch directory, deepest first.
        let mut mounts = mounts_under(&self.dirs.base).unwrap_or_default();
        mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for mount in mounts {
            let status = Command::new("umount")
                .args(["-l", &mount])
                .stderr(Stdio::null())
                .status();
            if !status.is_ok_and(|s| s.success()) {
                eprintln!("containerd teardown: could not unmount {mount}");
            }
        }
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.shut_down();
        }
    }
}

/// Removes the (empty) cgroup directories `parent` and below in every cgroup
/// hierarchy, deepest first, then `CGROUP_ROOT` where nothing else is left in
/// it. Only `rmdir`: a cgroup still holding a process stays.
fn remove_cgroups(parent: &str) {
    let Ok(mountinfo) = fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let hierarchies = mountinfo.lines().filter_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let fstype = right.split(' ').next()?;
        (fstype == "cgroup" || fstype == "cgroup2").then(|| left.split(' ').nth(4))?
    });
    for hierarchy in hierarchies {
        let top = Path::new(hierarchy).join(parent.trim_start_matches('/'));
        let mut dirs = Vec::new();
        let mut stack = vec![top];
        while let Some(dir) = stack.pop() {
            if let Ok(entries) = fs::read_dir(&dir) {
                stack.extend(
                    entries
                        .flatten()
                        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                        .map(|e| e.path()),
                );
                dirs.push(dir);
            }
        }
        for dir in dirs.iter().rev() {
            if let Err(e) = fs::remove_dir(dir) {
                eprintln!("containerd teardown: rmdir {}: {e}", dir.display());
            }
        }
        let _ = fs::remove_dir(Path::new(hierarchy).join(CGROUP_ROOT));
    }
}

fn signal(pid: i32, sig: rustix::process::Signal) {
    if let Some(pid) = rustix::process::Pid::from_raw(pid) {
        let _ = rustix::process::kill_process(pid, sig);
    }
}

/// Where containerd 1.7's shims put their sockets, whatever the daemon's
/// config says (`/run/containerd/s/<sha256 of address, namespace, id>`).
const SHIM_SOCKET_DIR: &str = "/run/containerd/s/";

/// Paths under `dir` of the unix sockets the processes `pids` hold open.
fn sockets_of(pids: &[i32], dir: &str) -> Vec<PathBuf> {
    let mut inodes = Vec::new();
    for pid in pids {
        let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = fs::read_link(fd.path())
                && let Some(inode) = target
                    .to_str()
                    .and_then(|t| t.strip_prefix("socket:["))
                    .and_then(|t| t.strip_suffix(']'))
            {
                inodes.push(inode.to_owned());
            }
        }
    }
    fs::read_to_string("/proc/net/unix")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (inode, path) = (fields.get(6)?, fields.get(7)?);
            (inodes.iter().any(|i| i == inode) && path.starts_with(dir))
                .then(|| PathBuf::from(path))
        })
        .collect()
}

/// Pids of processes whose command line contains `needle` (as one argument).
fn processes_whose_cmdline_has(needle: &str) -> Vec<i32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|arg| arg == needle.as_bytes()))
        })
        .collect()
}

/// `roots` and all their descendants, parents before children.
fn with_descendants(roots: &[i32]) -> Vec<i32> {
    let mut children: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
    if let Ok(entries) = fs::read_dir("/proc") {
        for pid in entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        {
            if let Some(ppid) = parent_pid(pid) {
                children.entry(ppid).or_default().push(pid);
            }
        }
    }
    let mut out = Vec::new();
    let mut queue: Vec<i32> = roots.to_vec();
    while let Some(pid) = queue.pop() {
        if out.contains(&pid) {
            continue;
        }
        out.push(pid);
        if let Some(kids) = children.get(&pid) {
            queue.extend(kids);
        }
    }
    out
}

/// The parent pid from `/proc/<pid>/stat` (field 4, after the `(comm)`).
pub fn parent_pid(pid: i32) -> Option<i32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

fn tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
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
                image: IMAGE.to_owned(),
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
