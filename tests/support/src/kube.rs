//! The Kubernetes API the cluster tests talk to: a kubeconfig, nothing else.
//!
//! By default a fresh stand-in API server (`tessera-sim apiserver`, from
//! `sim/kube/apiserver`) is started per test; when `TESSERA_E2E_KUBECONFIG`
//! names a kubeconfig, that cluster (kind, k3s, a real one) is used instead
//! and the same test runs unchanged. Tests build their own `kube::Client`
//! from the kubeconfig ([`client`]) and run Debian's `kubectl` with it
//! ([`kubectl`]).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::prereq::Need;

/// Names a kubeconfig of a real cluster to run the cluster tests against.
pub const KUBECONFIG_ENV: &str = "TESSERA_E2E_KUBECONFIG";

/// Overrides the `kubectl` the tests run.
pub const KUBECTL_ENV: &str = "TESSERA_KUBECTL";

/// Where `tessera_install_kubectl` (scripts/lib.sh) unpacks Debian's
/// kubernetes-client package (kubectl 1.32, from the trixie suite).
pub const DEFAULT_KUBECTL: &str = "/opt/tessera-e2e/kubernetes-client/usr/bin/kubectl";

/// What a test needs to start a stand-in API server.
pub fn needs() -> Vec<Need> {
    if std::env::var_os(KUBECONFIG_ENV).is_some() {
        return Vec::new();
    }
    vec![Need::Built("tessera-sim")]
}

/// What a test needs to run kubectl.
pub fn kubectl_needs() -> Vec<Need> {
    vec![Need::File {
        path: kubectl_path(),
        fix: "bash scripts/test.sh installs it (tessera_install_kubectl in scripts/lib.sh: Debian's kubernetes-client under /opt/tessera-e2e), or set TESSERA_KUBECTL".into(),
    }]
}

/// The kubectl the tests run: `$TESSERA_KUBECTL`, else [`DEFAULT_KUBECTL`].
pub fn kubectl_path() -> PathBuf {
    std::env::var_os(KUBECTL_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_KUBECTL))
}

/// `kubectl --kubeconfig <kubeconfig>`, ready for arguments.
pub fn kubectl(kubeconfig: &Path) -> Command {
    let mut cmd = Command::new(kubectl_path());
    cmd.arg("--kubeconfig").arg(kubeconfig);
    // No cache directory shared between tests (discovery is cached per host).
    cmd.env(
        "KUBECACHEDIR",
        std::env::temp_dir().join("tessera-kubectl-cache-off"),
    );
    cmd.arg("--cache-dir")
        .arg(std::env::temp_dir().join(format!("tessera-kubectl-cache-{}", std::process::id())));
    cmd
}

/// Runs [`kubectl`] with `args` and returns its stdout; fails with its
/// stdout and stderr when it exits non-zero.
pub fn kubectl_stdout(kubeconfig: &Path, args: &[&str]) -> Result<String> {
    let out = kubectl(kubeconfig)
        .args(args)
        .output()
        .with_context(|| format!("running kubectl {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "kubectl {} failed ({}):\n{}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// A kube-rs client for a kubeconfig file.
pub async fn client(kubeconfig: &Path) -> Result<kube::Client> {
    let config = kube::config::Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    let config =
        kube::Config::from_custom_kubeconfig(config, &kube::config::KubeConfigOptions::default())
            .await
            .context("kubeconfig")?;
    kube::Client::try_from(config).context("kube client")
}

/// Registers the Node `name` (bare: no labels, no status), as kubelet
/// would, unless it exists already.
pub async fn ensure_node(client: &kube::Client, name: &str) -> Result<()> {
    use k8s_openapi::api::core::v1::Node;
    let nodes: kube::Api<Node> = kube::Api::all(client.clone());
    if nodes.get_opt(name).await?.is_some() {
        return Ok(());
    }
    let node = Node {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        ..Default::default()
    };
    nodes
        .create(&kube::api::PostParams::default(), &node)
        .await
        .with_context(|| format!("creating Node {name}"))?;
    Ok(())
}

/// The cluster a test talks to.
pub enum Cluster {
    /// A stand-in API server this test started.
    StandIn(StandInApiServer),
    /// The cluster `TESSERA_E2E_KUBECONFIG` names.
    Real {
        /// Its kubeconfig.
        kubeconfig: PathBuf,
    },
}

impl Cluster {
    /// `TESSERA_E2E_KUBECONFIG`'s cluster, else a fresh stand-in.
    pub fn get() -> Result<Cluster> {
        match std::env::var_os(KUBECONFIG_ENV).filter(|v| !v.is_empty()) {
            Some(path) => Ok(Cluster::Real {
                kubeconfig: PathBuf::from(path),
            }),
            None => Ok(Cluster::StandIn(StandInApiServer::start(&[])?)),
        }
    }

    /// The kubeconfig to talk to it with.
    pub fn kubeconfig(&self) -> &Path {
        match self {
            Cluster::StandIn(server) => server.kubeconfig(),
            Cluster::Real { kubeconfig } => kubeconfig,
        }
    }

    /// The stand-in, when it is one (tests of the stand-in itself).
    pub fn stand_in(&mut self) -> Option<&mut StandInApiServer> {
        match self {
            Cluster::StandIn(server) => Some(server),
            Cluster::Real { .. } => None,
        }
    }
}

/// A `tessera-sim apiserver` child process on 127.0.0.1, with its kubeconfig
/// in a temporary directory; stopped (SIGTERM, then SIGKILL) on drop.
pub struct StandInApiServer {
    child: Option<Child>,
    dir: tempfile::TempDir,
    extra: Vec<String>,
    kubeconfig: PathBuf,
    log: PathBuf,
}

impl StandInApiServer {
    /// Starts one with extra `tessera-sim apiserver` arguments (e.g.
    /// `--state FILE`) and waits until its kubeconfig is written.
    pub fn start(extra: &[&str]) -> Result<StandInApiServer> {
        let dir = tempfile::Builder::new()
            .prefix("tessera-apiserver-")
            .tempdir()?;
        let kubeconfig = dir.path().join("kubeconfig");
        let log = dir.path().join("apiserver.log");
        let mut server = StandInApiServer {
            child: None,
            dir,
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            kubeconfig,
            log,
        };
        server.spawn()?;
        Ok(server)
    }

    fn spawn(&mut self) -> Result<()> {
        let _ = std::fs::remove_file(&self.kubeconfig);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let mut child = Command::new(crate::artefact("tessera-sim"))
            .arg("apiserver")
            .args(["--listen", "127.0.0.1:0", "--kubeconfig-out"])
            .arg(&self.kubeconfig)
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("spawning tessera-sim apiserver")?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.kubeconfig.is_file() {
            if let Some(status) = child.try_wait()? {
                bail!(
                    "tessera-sim apiserver exited with {status}:\n{}",
                    self.log_text()
                );
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                bail!(
                    "tessera-sim apiserver wrote no kubeconfig in 20 s:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.child = Some(child);
        Ok(())
    }

    /// Its kubeconfig (written by the server once it listens).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// Its scratch directory (for a `--state` file, say).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The server's URL, read from the kubeconfig.
    pub fn url(&self) -> Result<String> {
        let text = std::fs::read_to_string(&self.kubeconfig)?;
        text.lines()
            .find_map(|l| {
                l.trim()
                    .strip_prefix("server:")
                    .map(|s| s.trim().trim_matches('"').to_owned())
            })
            .context("kubeconfig names no server")
    }

    /// What the server logged so far.
    pub fn log_text(&self) -> String {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut text);
        }
        text
    }

    /// Stops it: SIGTERM, then SIGKILL after 10 s. Idempotent.
    pub fn stop(&mut self) {
        if let Some(child) = self.child.take() {
            crate::terminate(child, Duration::from_secs(10));
        }
    }

    /// Kills it with SIGKILL (a crash: no final save of `--state`) and
    /// waits for it to be gone. Idempotent; [`Self::restart`] starts it again
    /// (the port changes unless `--listen` fixed it).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops it and starts it again with the same arguments (and so the same
    /// `--state` file, when one was given). The port changes: re-read
    /// [`Self::kubeconfig`].
    pub fn restart(&mut self) -> Result<()> {
        self.stop();
        self.spawn()
    }
}

impl Drop for StandInApiServer {
    fn drop(&mut self) {
        self.stop();
    }
}
