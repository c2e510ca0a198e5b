//! The device plugin's end-to-end cluster: `tessera-sim cluster up
//! --detach` (stand-in API server, scheduler and kubelets, one containerd
//! 1.7 per node, with or without CDI), the shipped scheduler configuration
//! pointed at a `tessera-scheduler-extender` this harness runs, and one
//! real `tessera-device-plugin` per node with that node's directories, each
//! a child of the harness that a test can SIGKILL and restart. Logs go to
//! the cluster's `logs/` directory; the cluster is taken down on drop (and
//! its directory kept when the test failed, see [`PluginCluster::keep`]).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};
use tessera_model::contract::{annotations, resources};
use tessera_test_support::containerd;
use tessera_test_support::kube as tkube;
use tessera_test_support::rootfs::{SCRATCH_BASE, scratch_dir};
use tessera_test_support::{Need, artefact, hook_binary, run};

use crate::gpu_cluster::{self as gc, ExtenderProcess};

/// The node profile the plugin tests use: an H100-80GB shared as vGPU
/// slices (index 0) and an A100-40GB in MIG mode with no instances (index 1).
pub const PROFILE: &str = "dynamic";

/// The image that runs `tessera-cuda-probe` (`cluster up --cuda-probe`).
pub const CUDA_PROBE_IMAGE: &str = "localhost/tessera-sim/cuda-probe:latest";

/// `tessera-cuda-probe` inside [`CUDA_PROBE_IMAGE`].
pub const CUDA_PROBE: &str = "/usr/bin/tessera-cuda-probe";

/// The busybox image of every node.
pub const BUSYBOX_IMAGE: &str = containerd::IMAGE;

/// How the cluster is made.
#[derive(Debug, Clone)]
pub struct Options {
    /// Nodes `node-1` … `node-N`.
    pub nodes: u32,
    /// The node profile.
    pub profile: String,
    /// containerd's `enable_cdi` (false: `cluster up --no-cdi`).
    pub cdi: bool,
    /// The plugins' `--cdi-mode`.
    pub cdi_mode: String,
    /// Extra environment of every plugin.
    pub plugin_env: Vec<(String, String)>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            nodes: 1,
            profile: PROFILE.to_owned(),
            cdi: true,
            cdi_mode: "cdi-field".to_owned(),
            plugin_env: Vec::new(),
        }
    }
}

/// What the plugin tests need of the machine.
pub fn needs() -> Vec<Need> {
    let mut needs = vec![
        Need::Root,
        Need::Built("tessera-sim"),
        Need::Built("tessera-cdi"),
        Need::Built("tessera-scheduler-extender"),
        Need::Built("tessera-device-plugin"),
        Need::Built("tessera-cuda-probe"),
        Need::Built("libtessera_vgpu.so"),
        Need::Built("kubectl-tessera"),
        Need::Program("podman"),
        Need::Program("ldd"),
    ];
    needs.extend(containerd::needs());
    needs.extend(tkube::kubectl_needs());
    needs
}

fn append_log(path: &Path) -> Result<fs::File> {
    fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// One node's `tessera-device-plugin`, a child of the test.
pub struct PluginProcess {
    /// The node.
    pub node: String,
    /// Its metrics port on 127.0.0.1.
    pub metrics_port: u16,
    child: Option<Child>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    log: PathBuf,
}

impl PluginProcess {
    fn spawn_with(&mut self, extra_env: &[(&str, &str)]) -> Result<()> {
        let mut cmd = Command::new(artefact("tessera-device-plugin"));
        cmd.args(&self.args)
            .env_remove("KUBECONFIG")
            .env("TESSERA_LOG", "info,tessera_plugin=debug")
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::null())
            .stdout(append_log(&self.log)?)
            .stderr(append_log(&self.log)?);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().context("spawning tessera-device-plugin")?;
        self.child = Some(child);
        Ok(())
    }

    /// A crash: SIGKILL, and wait for it to be gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again with the same arguments (after [`Self::kill`]), with
    /// `extra_env` added (e.g. a failpoint).
    pub fn restart_with(&mut self, extra_env: &[(&str, &str)]) -> Result<()> {
        self.kill();
        std::fs::write(&self.log, format!("{}--- restarted ---\n", self.log_text())).ok();
        self.spawn_with(extra_env)
    }

    /// Starts it again with the same arguments.
    pub fn restart(&mut self) -> Result<()> {
        self.restart_with(&[])
    }

    /// Whether the process still runs.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Its exit status, once it exited.
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// What it logged so far.
    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log_text(), lines)
    }

    /// `GET /metrics` of its metrics endpoint.
    pub fn metrics(&self) -> Result<String> {
        let (status, body) = gc::http_get(self.metrics_port, "/metrics")?;
        ensure!(status == 200, "plugin /metrics answered {status}: {body}");
        Ok(body)
    }
}

impl Drop for PluginProcess {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            tessera_test_support::terminate(child, Duration::from_secs(5));
        }
    }
}

/// The cluster: `cluster down` on drop.
pub struct PluginCluster {
    /// The cluster's root (`tessera-sim cluster up --root`).
    pub root: PathBuf,
    /// Its kubeconfig.
    pub kubeconfig: PathBuf,
    /// A client of its API server.
    pub client: kube::Client,
    /// The scheduler extender the scheduler calls.
    pub extender: ExtenderProcess,
    /// One plugin per node, by node name.
    pub plugins: BTreeMap<String, PluginProcess>,
    /// Kubelets the harness restarted itself (the supervisor's are gone).
    kubelets: Vec<Child>,
    scratch: Option<tempfile::TempDir>,
    down: bool,
}

impl PluginCluster {
    /// Brings the cluster up and starts the extender and the plugins; ready
    /// (every node advertising `nvidia.com/gpu` and carrying
    /// `tessera.io/node-gpus`) when this returns.
    pub async fn start(tag: &str, options: &Options) -> Result<PluginCluster> {
        let scratch = scratch_dir(tag)?;
        let root = scratch.path().join("c");
        let work = scratch.path().to_owned();
        let kubeconfig = root.join("kubeconfig");
        let extender_port = tessera_test_support::free_port();
        let scheduler_config = work.join("scheduler-config.yaml");
        fs::write(
            &scheduler_config,
            gc::shipped_scheduler_config(extender_port, None, &kubeconfig)?,
        )?;
        let mut up = Command::new(artefact("tessera-sim"));
        up.args(["cluster", "up", "--detach", "--nodes"])
            .arg(options.nodes.to_string())
            .arg("--profile")
            .arg(&options.profile)
            .arg("--root")
            .arg(&root)
            .arg("--scheduler-config")
            .arg(&scheduler_config)
            .arg("--hook-path")
            .arg(hook_binary())
            .arg("--image-dir")
            .arg(Path::new(SCRATCH_BASE).join("images"))
            .arg("--containerd-bin-dir")
            .arg(containerd::bin_dir())
            .arg("--cuda-probe")
            .arg(artefact("tessera-cuda-probe"))
            .stdin(Stdio::null());
        if !options.cdi {
            up.arg("--no-cdi");
        }
        let started = Instant::now();
        let output = up.output().context("running tessera-sim cluster up")?;
        // From here on the cluster exists (or partly): taken down on drop.
        let client = tkube::client(&kubeconfig).await;
        let mut cluster_down_guard = DownGuard {
            root: root.clone(),
            armed: true,
        };
        ensure!(
            output.status.success(),
            "cluster up failed ({}):\n{}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        eprintln!("cluster up: {:.1?}", started.elapsed());
        let client = client?;
        let extender = ExtenderProcess::start(
            &root.join("logs"),
            &kubeconfig,
            &gc::shipped_cluster_config_path(),
            "e2e",
            extender_port,
        )
        .await?;
        let mut plugins = BTreeMap::new();
        for i in 1..=options.nodes {
            let node = format!("node-{i}");
            let dir = root.join("nodes").join(&node);
            let metrics_port = tessera_test_support::free_port();
            let args: Vec<String> = vec![
                "--node-name".into(),
                node.clone(),
                "--kubeconfig".into(),
                kubeconfig.display().to_string(),
                "--config".into(),
                gc::shipped_cluster_config_path().display().to_string(),
                "--driver-root".into(),
                dir.display().to_string(),
                "--kubelet-dir".into(),
                dir.join("var/lib/kubelet").display().to_string(),
                "--cdi-dir".into(),
                dir.join("cdi").display().to_string(),
                "--state-dir".into(),
                dir.join("var/lib/tessera").display().to_string(),
                "--cdi-mode".into(),
                options.cdi_mode.clone(),
                "--hook-path".into(),
                hook_binary().display().to_string(),
                "--hook-config".into(),
                dir.join("etc/tessera/hook.toml").display().to_string(),
                "--vgpu-library".into(),
                artefact("libtessera_vgpu.so").display().to_string(),
                "--metrics-listen".into(),
                format!("127.0.0.1:{metrics_port}"),
            ];
            let mut plugin = PluginProcess {
                node: node.clone(),
                metrics_port,
                child: None,
                args,
                env: options.plugin_env.clone(),
                log: root.join("logs").join(format!("plugin-{node}.log")),
            };
            plugin.spawn_with(&[])?;
            plugins.insert(node, plugin);
        }
        cluster_down_guard.armed = false;
        let cluster = PluginCluster {
            root,
            kubeconfig,
            client,
            extender,
            plugins,
            kubelets: Vec::new(),
            scratch: Some(scratch),
            down: false,
        };
        for node in cluster.plugins.keys() {
            cluster
                .wait_registered(node, Duration::from_secs(60))
                .await
                .with_context(|| cluster.logs())?;
        }
        eprintln!("cluster with plugins ready: {:.1?}", started.elapsed());
        Ok(cluster)
    }

    /// A node's directory (its simulated GPU node and kubelet root).
    pub fn node_dir(&self, node: &str) -> PathBuf {
        self.root.join("nodes").join(node)
    }

    /// A node's plugin.
    pub fn plugin(&mut self, node: &str) -> &mut PluginProcess {
        self.plugins.get_mut(node).expect("a node of the cluster")
    }

    /// Keeps the cluster's directory (logs) after the test, and says where.
    pub fn keep(&mut self) {
        if let Some(s) = self.scratch.as_mut() {
            s.disable_cleanup(true);
            eprintln!("cluster directory kept: {}", s.path().display());
        }
    }

    /// The tails of every log of interest, for a failure message.
    pub fn logs(&self) -> String {
        let mut text = String::new();
        for (node, p) in &self.plugins {
            text.push_str(&format!("\n--- plugin {node} ---\n{}", p.log_tail(40)));
        }
        text.push_str(&format!(
            "\n--- extender ---\n{}",
            self.extender.log_tail(25)
        ));
        for name in ["scheduler", "kubelet-node-1"] {
            let log = self.root.join("logs").join(format!("{name}.log"));
            text.push_str(&format!(
                "\n--- {name} ---\n{}",
                tail(&fs::read_to_string(&log).unwrap_or_default(), 25)
            ));
        }
        text
    }

    /// Waits until `node`'s Node carries `tessera.io/node-gpus` and
    /// advertises `nvidia.com/gpu` (the plugin registered with kubelet).
    pub async fn wait_registered(&self, node: &str, timeout: Duration) -> Result<Node> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(n) = nodes.get(node).await {
                let annotated = n
                    .metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key(annotations::NODE_GPUS));
                if annotated && gpu_capacity(&n) > 0 {
                    return Ok(n);
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "{node}: no {} capacity and node-gpus after {timeout:?}",
                    resources::GPU
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The pods API of `namespace`.
    pub fn pods(&self, namespace: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// Creates `pod` (JSON of a Pod).
    pub async fn create_pod(&self, namespace: &str, pod: Value) -> Result<Pod> {
        let pod: Pod = serde_json::from_value(pod)?;
        let name = pod.metadata.name.clone().unwrap_or_default();
        self.pods(namespace)
            .create(&PostParams::default(), &pod)
            .await
            .with_context(|| format!("creating pod {name}"))
    }

    /// Waits until the pod is Running (every container running); fails
    /// early when it failed or ended.
    pub async fn wait_running(
        &self,
        namespace: &str,
        name: &str,
        timeout: Duration,
    ) -> Result<Pod> {
        let deadline = Instant::now() + timeout;
        loop {
            let pod = self.pods(namespace).get(name).await?;
            let phase = phase(&pod);
            if phase == "Running" && all_containers_running(&pod) {
                return Ok(pod);
            }
            if matches!(phase.as_str(), "Failed" | "Succeeded") {
                bail!(
                    "pod {name} is {phase}: {}",
                    serde_json::to_string(&pod.status).unwrap_or_default()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "pod {name} not Running after {timeout:?}: {}; annotations {:?}",
                    serde_json::to_string(&pod.status).unwrap_or_default(),
                    pod.metadata.annotations
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Waits until the pod's phase is `want`.
    pub async fn wait_phase(
        &self,
        namespace: &str,
        name: &str,
        want: &str,
        timeout: Duration,
    ) -> Result<Pod> {
        let deadline = Instant::now() + timeout;
        loop {
            let pod = self.pods(namespace).get(name).await?;
            if phase(&pod) == want {
                return Ok(pod);
            }
            if Instant::now() > deadline {
                bail!(
                    "pod {name} not {want} after {timeout:?}: {}",
                    serde_json::to_string(&pod.status).unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Deletes the pod (grace 0) and waits until the API server no longer
    /// has it.
    pub async fn delete_pod(&self, namespace: &str, name: &str, timeout: Duration) -> Result<()> {
        let api = self.pods(namespace);
        let _ = api
            .delete(name, &DeleteParams::default().grace_period(0))
            .await;
        let deadline = Instant::now() + timeout;
        while api.get_opt(name).await?.is_some() {
            if Instant::now() > deadline {
                bail!("pod {name} still there {timeout:?} after delete");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    }

    /// The text a pod's container wrote to stdout/stderr (attempt 0), as the
    /// kubelet stand-in keeps it under the node, CRI log prefixes removed.
    pub fn container_log(&self, node: &str, pod: &Pod, container: &str) -> Result<String> {
        let dir = self.node_dir(node).join("var/log/pods").join(format!(
            "{}_{}_{}",
            pod.metadata.namespace.as_deref().unwrap_or_default(),
            pod.metadata.name.as_deref().unwrap_or_default(),
            pod.metadata.uid.as_deref().unwrap_or_default()
        ));
        let file = dir.join(container).join("0.log");
        let text =
            fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
        // `<time> <stream> <tag> <text>` per line.
        Ok(text
            .lines()
            .map(|l| l.splitn(4, ' ').nth(3).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n"))
    }

    /// Waits until the container's log holds a line starting with `marker`.
    pub async fn wait_log(
        &self,
        node: &str,
        pod: &Pod,
        container: &str,
        marker: &str,
        timeout: Duration,
    ) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(text) = self.container_log(node, pod, container)
                && text.lines().any(|l| l.starts_with(marker))
            {
                return Ok(text);
            }
            if Instant::now() > deadline {
                bail!(
                    "no {marker:?} in {}'s {container} log after {timeout:?}: {:?}",
                    pod.metadata.name.as_deref().unwrap_or_default(),
                    self.container_log(node, pod, container).ok()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `GET /metrics` of the extender.
    pub fn extender_metrics(&self) -> Result<String> {
        let (status, body) = gc::http_get(self.extender.port, "/metrics")?;
        ensure!(status == 200, "extender /metrics answered {status}: {body}");
        Ok(body)
    }

    /// `kubectl tessera inspect -d -o json`, parsed: kubectl finds the
    /// `kubectl-tessera` plugin on `PATH` (the build's directory first).
    pub fn inspect(&self) -> Result<Value> {
        let plugin_dir = artefact("kubectl-tessera")
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut dirs = vec![plugin_dir];
        dirs.extend(std::env::split_paths(&path));
        let out = run(Command::new(tkube::kubectl_path())
            .args(["tessera", "inspect", "-d", "-o", "json", "--kubeconfig"])
            .arg(&self.kubeconfig)
            .env("PATH", std::env::join_paths(dirs)?))?;
        Ok(serde_json::from_slice(&out.stdout)?)
    }

    /// The simulated node's NVML state (`run/tessera-sim/state.json`).
    pub fn sim_state(&self, node: &str) -> Result<Value> {
        let path = self.node_dir(node).join("run/tessera-sim/state.json");
        let text =
            fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        Ok(serde_json::from_str(&text)?)
    }

    /// The GPU instances of GPU `index` of `node` as the simulated NVML has
    /// them: `(gi id, profile id, start, size, [ci uuid])`.
    pub fn gpu_instances(&self, node: &str, index: u64) -> Result<Vec<SimGi>> {
        let state = self.sim_state(node)?;
        let gpu = state["gpus"]
            .as_array()
            .and_then(|g| g.iter().find(|g| g["index"] == index))
            .with_context(|| format!("{node}: no GPU {index} in the simulated state"))?;
        Ok(gpu["gpu_instances"]
            .as_array()
            .map(|gis| {
                gis.iter()
                    .map(|gi| SimGi {
                        id: gi["id"].as_u64().unwrap_or(u64::MAX),
                        profile_id: gi["profile_id"].as_u64().unwrap_or(u64::MAX),
                        start: gi["start"].as_u64().unwrap_or(u64::MAX),
                        size: gi["size"].as_u64().unwrap_or(u64::MAX),
                        compute_instances: gi["compute_instances"]
                            .as_array()
                            .map(|cis| {
                                cis.iter()
                                    .map(|ci| {
                                        (
                                            ci["id"].as_u64().unwrap_or(u64::MAX),
                                            ci["uuid"].as_str().unwrap_or_default().to_owned(),
                                        )
                                    })
                                    .collect()
                            })
                            .unwrap_or_default(),
                    })
                    .collect()
            })
            .unwrap_or_default())
    }

    /// The transient CDI specs (`tessera.io-alloc_*.json`) in `node`'s CDI
    /// directory, by file name.
    pub fn transient_specs(&self, node: &str) -> Result<Vec<String>> {
        let dir = self.node_dir(node).join("cdi");
        let empty = tessera_model::contract::cdi::transient_spec_file("");
        let prefix = empty.trim_end_matches(".json");
        let mut names: Vec<String> = fs::read_dir(&dir)?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(prefix))
            .collect();
        names.sort();
        Ok(names)
    }

    /// Restarts `node`'s kubelet as kubelet restarts (containers keep
    /// running, the device plugin directory is wiped): SIGTERM to the
    /// running one, then the same command line again, as a child of the
    /// harness (the cluster's sweep stops it at `down`).
    pub async fn restart_kubelet(&mut self, node: &str) -> Result<()> {
        let pid = kubelet_pid(&self.root, node)?;
        let cmdline = fs::read(format!("/proc/{pid}/cmdline"))?;
        let argv: Vec<String> = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        ensure!(argv.len() > 1, "kubelet {pid}: empty command line");
        let pid_t = rustix::process::Pid::from_raw(pid).context("pid 0")?;
        rustix::process::kill_process(pid_t, rustix::process::Signal::TERM)?;
        let deadline = Instant::now() + Duration::from_secs(15);
        while Path::new(&format!("/proc/{pid}")).exists() && is_kubelet(pid) {
            if Instant::now() > deadline {
                bail!("kubelet {pid} still running 15 s after SIGTERM");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let log = self.root.join("logs").join(format!("kubelet-{node}.log"));
        let child = Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(append_log(&log)?)
            .stderr(append_log(&log)?)
            .spawn()
            .context("starting the kubelet again")?;
        self.kubelets.push(child);
        Ok(())
    }

    /// `cluster down`, once.
    pub fn down(&mut self) -> Result<()> {
        if self.down {
            return Ok(());
        }
        self.down = true;
        for (_, mut p) in std::mem::take(&mut self.plugins) {
            p.kill();
        }
        run(Command::new(artefact("tessera-sim"))
            .args(["cluster", "down", "--root"])
            .arg(&self.root))?;
        for mut k in self.kubelets.drain(..) {
            let _ = k.kill();
            let _ = k.wait();
        }
        Ok(())
    }
}

impl Drop for PluginCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.keep();
        }
        if let Err(e) = self.down() {
            eprintln!("cluster down: {e:#}");
            self.keep();
        }
    }
}

/// Takes a half-made cluster down when `start` fails.
struct DownGuard {
    root: PathBuf,
    armed: bool,
}

impl Drop for DownGuard {
    fn drop(&mut self) {
        if self.armed {
            let _ = Command::new(artefact("tessera-sim"))
                .args(["cluster", "down", "--root"])
                .arg(&self.root)
                .status();
        }
    }
}

/// A GPU instance as the simulated NVML state holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimGi {
    /// GPU instance id.
    pub id: u64,
    /// GI profile id.
    pub profile_id: u64,
    /// Placement start.
    pub start: u64,
    /// Placement size.
    pub size: u64,
    /// Its compute instances: (id, MIG uuid).
    pub compute_instances: Vec<(u64, String)>,
}

fn is_kubelet(pid: i32) -> bool {
    fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == b"kubelet"))
}

/// The pid of `node`'s running kubelet (`tessera-sim kubelet --node
/// <node> --root <root>/nodes/<node>`), found in `/proc`.
fn kubelet_pid(root: &Path, node: &str) -> Result<i32> {
    let node_dir = root.join("nodes").join(node).display().to_string();
    for entry in fs::read_dir("/proc")? {
        let Ok(entry) = entry else { continue };
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let has = |s: &str| args.contains(&s.as_bytes());
        if has("kubelet") && has("--node") && has(node) && has(&node_dir) {
            return Ok(pid);
        }
    }
    bail!("no kubelet process for {node}")
}

/// A node's `nvidia.com/gpu` capacity (0 when absent).
pub fn gpu_capacity(node: &Node) -> u64 {
    node.status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get(resources::GPU))
        .and_then(|q| q.0.parse().ok())
        .unwrap_or(0)
}

/// The pod's phase ("" when it has none).
pub fn phase(pod: &Pod) -> String {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

fn all_containers_running(pod: &Pod) -> bool {
    let want = pod.spec.as_ref().map_or(0, |s| s.containers.len());
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.clone())
        .unwrap_or_default();
    statuses.len() == want
        && statuses
            .iter()
            .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
}

/// One container of [`pod_json`]: `(name, image, shell command, limits)`.
pub type ContainerSpec<'a> = (&'a str, &'a str, &'a str, &'a [(&'a str, &'a str)]);

/// A pod of `containers` `(name, image, shell command, limits)`, with pod
/// annotations, `restartPolicy: Never` and a 1 s grace period.
pub fn pod_json(
    namespace: &str,
    name: &str,
    annotations: &BTreeMap<String, String>,
    containers: &[ContainerSpec<'_>],
) -> Value {
    let containers: Vec<Value> = containers
        .iter()
        .map(|(cname, image, script, limits)| {
            let limits: serde_json::Map<String, Value> = limits
                .iter()
                .map(|(k, v)| ((*k).to_owned(), json!(v)))
                .collect();
            json!({
                "name": cname,
                "image": image,
                "command": ["/bin/sh", "-c", script],
                "resources": {"limits": limits},
            })
        })
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": containers,
        },
    })
}

/// Prometheus text lines of metric `name` (exactly that family).
pub fn metric_lines<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .collect()
}

/// The value of label `label` in a Prometheus text line.
pub fn label<'a>(line: &'a str, label: &str) -> Option<&'a str> {
    let start = line.find(&format!("{label}=\""))? + label.len() + 2;
    let rest = &line[start..];
    Some(&rest[..rest.find('"')?])
}
