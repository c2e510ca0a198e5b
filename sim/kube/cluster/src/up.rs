//! `cluster up`: build the nodes, start the services in order, wait until
//! every node is Ready, then supervise until SIGINT/SIGTERM and take
//! everything down again.
//!
//! Order: the API server first (everything else talks to it), then per node
//! the simulated GPU node (`tessera-sim create`), its static CDI spec
//! (`tessera-cdi generate`) and its containerd with the busybox image, then
//! the scheduler and the kubelets. Teardown runs the other way: scheduler,
//! kubelets, containerds (their containers first), the API server last, then
//! a sweep for anything still naming the root on its command line and for
//! mounts below it.
//!
//! Every service runs in its own process group, so a Ctrl-C at the terminal
//! reaches only the supervisor, which stops the services in order.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};

use crate::Error;
use crate::containerd::{self, Daemon, DaemonDirs, Options};
use crate::image;
use crate::proc;
use crate::state::{ClusterState, NodeState, ServiceState};

/// The container runtime of the simulated nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Runtime {
    /// One private containerd 1.7 per node, over CRI, with CDI.
    Containerd,
    /// podman (kubelets with `--podman`).
    Podman,
    /// No containers: kubelets record the CRI requests (for many nodes).
    DryRun,
}

impl Runtime {
    fn name(self) -> &'static str {
        match self {
            Runtime::Containerd => "containerd",
            Runtime::Podman => "podman",
            Runtime::DryRun => "dry-run",
        }
    }
}

/// Options of `cluster up`.
#[derive(Debug, Clone, clap::Args)]
pub struct UpArgs {
    /// The cluster's root directory (nodes, logs, kubeconfig, state).
    #[arg(long, value_name = "DIR")]
    pub root: PathBuf,
    /// Number of nodes (`node-1` … `node-N`).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=2000))]
    pub nodes: u32,
    /// The GPU node profile (see `tessera-sim profiles`): one name for every
    /// node, or a comma-separated list with one name per node, in order
    /// (`--profile a100-40gb-dynamic,h100-80gb` with `--nodes 2`).
    #[arg(long, default_value = "demo")]
    pub profile: String,
    /// A KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1) for the
    /// scheduler; default: one profile, no extenders.
    #[arg(long, value_name = "FILE")]
    pub scheduler_config: Option<PathBuf>,
    /// The nodes' container runtime.
    #[arg(long, value_enum, default_value = "containerd")]
    pub runtime: Runtime,
    /// Return once the cluster is ready, leaving a supervisor in the
    /// background (its pid in DIR/cluster.json; stop it with `cluster down`).
    #[arg(long)]
    pub detach: bool,
    /// Directory of containerd 1.7's binaries (default:
    /// $TESSERA_CONTAINERD_BIN_DIR or /opt/tessera-e2e/containerd-1.7/usr/bin).
    #[arg(long, value_name = "DIR")]
    pub containerd_bin_dir: Option<PathBuf>,
    /// The hook binary the static CDI specs name (default: tessera-hook next
    /// to tessera-sim, else /usr/bin/tessera-hook).
    #[arg(long, value_name = "FILE")]
    pub hook_path: Option<PathBuf>,
    /// Where the busybox image archive is built and kept (default DIR/images).
    #[arg(long, value_name = "DIR")]
    pub image_dir: Option<PathBuf>,
    /// With `--runtime podman`: an extra argument for each `podman create`
    /// of the kubelets (repeatable), e.g. `--podman-arg=--runtime=/usr/sbin/runc`.
    #[arg(long = "podman-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub podman_args: Vec<String>,
    /// With containerd: CDI off (`enable_cdi = false`), a runtime without
    /// CDI, for device plugins that answer Allocate natively (devices,
    /// mounts, envs).
    #[arg(long)]
    pub no_cdi: bool,
    /// Also build the cuda-probe image (`localhost/tessera-sim/cuda-probe:latest`:
    /// busybox, the host's glibc and this `tessera-cuda-probe`) and import it
    /// into every node's runtime.
    #[arg(long, value_name = "FILE")]
    pub cuda_probe: Option<PathBuf>,
    /// Seconds to wait for every node to be Ready.
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub ready_timeout: u64,
}

/// How long a service gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// The default scheduler configuration: one profile, no extenders.
pub const DEFAULT_SCHEDULER_CONFIG: &str = "\
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: default-scheduler
";

impl UpArgs {
    /// The profile of each node, `node-1` first: `--profile` names one for
    /// every node or one per node (comma-separated).
    pub fn node_profiles(&self) -> Result<Vec<String>, Error> {
        let names: Vec<String> = self
            .profile
            .split(',')
            .map(|n| n.trim().to_owned())
            .collect();
        if names.iter().any(String::is_empty) {
            return Err(Error::Usage {
                option: "--profile",
                reason: format!("{:?} has an empty profile name", self.profile),
            });
        }
        match names.len() {
            1 => Ok(vec![names[0].clone(); self.nodes as usize]),
            n if n == self.nodes as usize => Ok(names),
            n => Err(Error::Usage {
                option: "--profile",
                reason: format!(
                    "{n} profiles for {} nodes: give one for every node or one per node",
                    self.nodes
                ),
            }),
        }
    }
}

/// Runs `cluster up`.
pub fn run(args: UpArgs) -> Result<(), Error> {
    // Checked before the root is claimed: a bad list changes nothing.
    args.node_profiles()?;
    let root = crate::root_for_up(&args.root)?;
    let args = UpArgs { root, ..args };
    refuse_if_in_use(&args.root)?;
    // Claim the directory (a state file makes it a cluster's) before
    // writing anything else into it.
    if !ClusterState::path(&args.root).exists() {
        ClusterState {
            root: args.root.clone(),
            kubeconfig: args.root.join("kubeconfig"),
            runtime: args.runtime.name().to_owned(),
            ..ClusterState::default()
        }
        .write()?;
    }
    fs::create_dir_all(args.root.join("logs")).map_err(io(&args.root))?;
    if args.detach {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(Error::Runtime)?;
        return rt.block_on(detach(&args));
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(Error::Runtime)?;
    rt.block_on(supervise(args))
}

fn absolute(path: &Path, option: &'static str) -> Result<PathBuf, Error> {
    std::path::absolute(path).map_err(|e| Error::Usage {
        option,
        reason: format!("{}: {e}", path.display()),
    })
}

/// Refuses a root whose recorded supervisor or services still run (pid and
/// start time), or where an earlier cluster left processes or mounts: `up`
/// would otherwise wipe directories a live containerd uses.
fn refuse_if_in_use(root: &Path) -> Result<(), Error> {
    let in_use = |what: String| Error::AlreadyUp {
        root: root.to_owned(),
        what,
    };
    match ClusterState::read(root) {
        Ok(state) => {
            if state.supervisor_running() {
                return Err(in_use(format!(
                    "a cluster is up (supervisor pid {})",
                    state.supervisor_pid.unwrap_or_default()
                )));
            }
            let running: Vec<String> = state
                .running_services()
                .iter()
                .map(|s| format!("{} (pid {})", s.name, s.pid))
                .collect();
            if !running.is_empty() {
                return Err(in_use(format!(
                    "services of an earlier cluster still run: {}",
                    running.join(", ")
                )));
            }
        }
        Err(crate::state::StateError::Missing(_)) => {}
        Err(e) => return Err(e.into()),
    }
    let left = proc::leftovers_of(root);
    let mounts = proc::mounts_below_nodes(root);
    if !left.is_empty() || !mounts.is_empty() {
        return Err(in_use(format!(
            "an earlier cluster left processes {left:?} and mounts {mounts:?}"
        )));
    }
    Ok(())
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_owned(),
        source,
    }
}

/// How long a supervisor gets to take its cluster down after SIGTERM
/// before it is killed and its leftovers swept.
pub const SUPERVISOR_GRACE: Duration = Duration::from_secs(120);

/// `--detach`: start `cluster up` again without it, in a process group of
/// its own with its output in DIR/logs/cluster.log, and wait until it says
/// the cluster is ready (or dies). A timeout, SIGINT, SIGTERM or SIGHUP
/// here makes it take the cluster down (SIGTERM), waited for.
async fn detach(args: &UpArgs) -> Result<(), Error> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(Error::Runtime)?;
    let mut int = signal(SignalKind::interrupt()).map_err(Error::Runtime)?;
    let mut hup = signal(SignalKind::hangup()).map_err(Error::Runtime)?;
    let exe = std::env::current_exe().map_err(io(Path::new("/proc/self/exe")))?;
    let log_path = args.root.join("logs/cluster.log");
    let log = fs::File::create(&log_path).map_err(io(&log_path))?;
    let log2 = log.try_clone().map_err(io(&log_path))?;
    let mut cmd = Command::new(&exe);
    cmd.arg("cluster").arg("up").args(forwarded(args));
    let mut child = std::os::unix::process::CommandExt::process_group(
        cmd.stdin(Stdio::null()).stdout(log).stderr(log2),
        0,
    )
    .spawn()
    .map_err(io(&exe))?;
    let deadline = Instant::now() + Duration::from_secs(args.ready_timeout + 300);
    let failure = loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(Error::Step {
                step: "cluster up (supervisor)".into(),
                reason: format!(
                    "exited with {status}; {}:\n{}",
                    log_path.display(),
                    containerd::tail(&log_path, 20)
                ),
            });
        }
        if let Ok(state) = ClusterState::read(&args.root)
            && state.ready
            && state.supervisor_pid == Some(child.id())
        {
            print!("{}", usage(&state));
            return Ok(());
        }
        if Instant::now() > deadline {
            break Error::Step {
                step: "cluster up (supervisor)".into(),
                reason: format!("not ready in time (taken down); see {}", log_path.display()),
            };
        }
        tokio::select! {
            _ = term.recv() => break Error::Interrupted,
            _ = int.recv() => break Error::Interrupted,
            _ = hup.recv() => break Error::Interrupted,
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    };
    // The child is not reaped yet (try_wait said None): its pid is its own.
    if let Ok(pid) = i32::try_from(child.id()) {
        proc::signal(pid, rustix::process::Signal::TERM);
    }
    let stop_deadline = Instant::now() + SUPERVISOR_GRACE;
    while matches!(child.try_wait(), Ok(None)) && Instant::now() < stop_deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if matches!(child.try_wait(), Ok(None)) {
        tracing::warn!("the supervisor did not stop in time; killing it");
        let _ = child.kill();
        let _ = child.wait();
    }
    sweep(&args.root);
    Err(failure)
}

/// The arguments of `up` less `--detach`, for the supervisor.
fn forwarded(args: &UpArgs) -> Vec<std::ffi::OsString> {
    let mut out: Vec<std::ffi::OsString> = vec![
        "--root".into(),
        args.root.clone().into(),
        "--nodes".into(),
        args.nodes.to_string().into(),
        "--profile".into(),
        args.profile.clone().into(),
        "--runtime".into(),
        args.runtime.name().into(),
        "--ready-timeout".into(),
        args.ready_timeout.to_string().into(),
    ];
    for arg in &args.podman_args {
        out.push(format!("--podman-arg={arg}").into());
    }
    if args.no_cdi {
        out.push("--no-cdi".into());
    }
    let paths = [
        ("--scheduler-config", &args.scheduler_config),
        ("--containerd-bin-dir", &args.containerd_bin_dir),
        ("--hook-path", &args.hook_path),
        ("--image-dir", &args.image_dir),
        ("--cuda-probe", &args.cuda_probe),
    ];
    for (flag, value) in paths {
        if let Some(v) = value {
            out.push(flag.into());
            out.push(std::path::absolute(v).unwrap_or_else(|_| v.clone()).into());
        }
    }
    out
}

/// How to use the cluster, printed once it is ready.
pub fn usage(state: &ClusterState) -> String {
    let root = state.root.display();
    format!(
        "cluster ready under {root}: {} node(s), runtime {}\n\
         \n  export KUBECONFIG={}\n  kubectl get nodes\n\n\
         logs in {root}/logs; `tessera-sim cluster status --root {root}`; \
         stop with `tessera-sim cluster down --root {root}`{}\n",
        state.nodes.len(),
        state.runtime,
        state.kubeconfig.display(),
        if state.supervisor_pid == Some(std::process::id()) {
            " or Ctrl-C"
        } else {
            ""
        }
    )
}

/// A long-running child.
struct Service {
    name: String,
    child: Child,
    start_time: u64,
    socket: Option<String>,
    log: PathBuf,
    dead_reported: bool,
}

/// Everything `up` started, so that a failure or a signal at any moment
/// takes exactly that down.
struct Cluster {
    state: ClusterState,
    services: Vec<Service>,
    daemons: Vec<(String, Daemon)>,
    /// When `up` started (seconds since the epoch): nodes count as Ready
    /// only with a heartbeat since.
    started_at: i64,
    /// Whether [`Cluster::tear_down`] ran (else Drop runs it).
    torn_down: bool,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if !self.torn_down {
            self.tear_down();
        }
    }
}

impl Cluster {
    fn save(&mut self) {
        self.state.services = self
            .services
            .iter()
            .map(|s| ServiceState {
                name: s.name.clone(),
                pid: s.child.id(),
                start_time: s.start_time,
                socket: s.socket.clone(),
                log: s.log.clone(),
            })
            .chain(self.daemons.iter_mut().filter_map(|(node, d)| {
                let pid = d.pid()?;
                Some(ServiceState {
                    name: format!("containerd-{node}"),
                    pid,
                    start_time: i32::try_from(pid).ok().and_then(proc::start_time)?,
                    socket: Some(d.dirs().endpoint()),
                    log: d.dirs().log(),
                })
            }))
            .collect();
        if let Err(e) = self.state.write() {
            tracing::error!("{e}");
        }
    }

    /// Spawns `exe args` as the service `name`, logging to DIR/logs/<name>.log.
    fn spawn(
        &mut self,
        name: &str,
        exe: &Path,
        args: &[std::ffi::OsString],
        socket: Option<String>,
    ) -> Result<(), Error> {
        let log = self.state.root.join("logs").join(format!("{name}.log"));
        let file = fs::File::create(&log).map_err(io(&log))?;
        let file2 = file.try_clone().map_err(io(&log))?;
        let child = std::os::unix::process::CommandExt::process_group(
            Command::new(exe)
                .args(args)
                .stdin(Stdio::null())
                .stdout(file)
                .stderr(file2),
            0,
        )
        .spawn()
        .map_err(|e| Error::Step {
            step: name.to_owned(),
            reason: format!("starting {}: {e}", exe.display()),
        })?;
        tracing::info!(service = name, pid = child.id(), log = %log.display(), "started");
        // Not reaped before it is recorded, so the pid is still its own.
        let start_time = i32::try_from(child.id())
            .ok()
            .and_then(proc::start_time)
            .unwrap_or_default();
        self.services.push(Service {
            name: name.to_owned(),
            child,
            start_time,
            socket,
            log,
            dead_reported: false,
        });
        self.save();
        Ok(())
    }

    /// Reports (once) services that exited; whether any did.
    fn check(&mut self) -> bool {
        let mut any = false;
        for s in &mut self.services {
            if !s.dead_reported
                && let Ok(Some(status)) = s.child.try_wait()
            {
                s.dead_reported = true;
                any = true;
                tracing::error!(service = %s.name, %status, log = %s.log.display(), "service exited");
            }
        }
        for (node, d) in &mut self.daemons {
            if !d.alive() {
                tracing::error!(node = %node, "containerd exited");
                any = true;
            }
        }
        any
    }

    /// Stops everything, in reverse dependency order.
    fn tear_down(&mut self) {
        self.torn_down = true;
        tracing::info!("taking the cluster down");
        self.state.ready = false;
        let mut services = std::mem::take(&mut self.services);
        let (apiserver, rest): (Vec<Service>, Vec<Service>) =
            services.drain(..).partition(|s| s.name == "apiserver");
        stop_services(rest);
        if self.state.runtime == Runtime::Podman.name() {
            for node in &self.state.nodes {
                remove_podman_pods(&node.name);
            }
        }
        for (node, mut daemon) in self.daemons.drain(..) {
            tracing::info!(node, "stopping containerd and its containers");
            daemon.shut_down();
        }
        stop_services(apiserver);
        sweep(&self.state.root);
        self.state.supervisor_pid = None;
        self.state.supervisor_start_time = None;
        self.state.services.clear();
        if let Err(e) = self.state.write() {
            tracing::error!("{e}");
        }
    }
}

/// SIGTERM to each, then SIGKILL to those still there after [`STOP_GRACE`].
fn stop_services(mut services: Vec<Service>) {
    for s in &mut services {
        // One already reaped has no pid any more (it may be someone else's).
        if matches!(s.child.try_wait(), Ok(None))
            && let Ok(pid) = i32::try_from(s.child.id())
        {
            proc::signal(pid, rustix::process::Signal::TERM);
        }
    }
    let deadline = Instant::now() + STOP_GRACE;
    for s in &mut services {
        while Instant::now() < deadline && matches!(s.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        if matches!(s.child.try_wait(), Ok(None)) {
            tracing::warn!(service = %s.name, "did not stop on SIGTERM; killing it");
            let _ = s.child.kill();
        }
        let _ = s.child.wait();
    }
}

/// Removes the podman pods (and their containers) the kubelet of `node`
/// made; they outlive the kubelet (podman's conmon is no child of it).
/// Pods are found by the node label the podman runtime puts on them, so two
/// podman-runtime clusters on one machine would share them.
pub fn remove_podman_pods(node: &str) {
    let filter = format!(
        "label={}={node}",
        tessera_kube_kubelet::runtime::labels::NODE
    );
    let ids = Command::new("podman")
        .args(["pod", "ps", "-q", "--filter", &filter])
        .stderr(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    for id in ids.split_whitespace() {
        let removed = Command::new("podman")
            .args(["pod", "rm", "-f", "-t", "0", id])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !removed {
            tracing::warn!(node, pod = id, "podman pod rm failed");
        }
    }
}

/// Kills what a cluster rooted at `root` left ([`proc::leftovers_of`]:
/// `tessera-sim`, containerd and shims naming a path below the root, and
/// processes living in a container rootfs below `root/nodes`) with their
/// descendants, and unmounts what is mounted below a node directory.
pub fn sweep(root: &Path) {
    let left = proc::leftovers_of(root);
    if !left.is_empty() {
        let doomed = proc::with_descendants(&left);
        tracing::warn!(?doomed, "killing processes left under the root");
        for pid in doomed.iter().rev() {
            proc::signal(*pid, rustix::process::Signal::KILL);
        }
        proc::wait_gone(&doomed, Duration::from_secs(5));
    }
    proc::unmount(proc::mounts_below_nodes(root));
}

/// Brings the cluster up and supervises it until a signal.
async fn supervise(args: UpArgs) -> Result<(), Error> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(Error::Runtime)?;
    let mut int = signal(SignalKind::interrupt()).map_err(Error::Runtime)?;
    let mut hup = signal(SignalKind::hangup()).map_err(Error::Runtime)?;
    let me = std::process::id();
    let mut cluster = Cluster {
        state: ClusterState {
            root: args.root.clone(),
            supervisor_pid: Some(me),
            supervisor_start_time: i32::try_from(me).ok().and_then(proc::start_time),
            ready: false,
            kubeconfig: args.root.join("kubeconfig"),
            runtime: args.runtime.name().to_owned(),
            services: Vec::new(),
            nodes: Vec::new(),
        },
        services: Vec::new(),
        daemons: Vec::new(),
        torn_down: false,
        started_at: now_seconds(),
    };
    cluster.save();
    let started = tokio::select! {
        r = bring_up(&mut cluster, &args) => r,
        _ = term.recv() => Err(Error::Interrupted),
        _ = int.recv() => Err(Error::Interrupted),
        _ = hup.recv() => Err(Error::Interrupted),
    };
    if let Err(e) = started {
        tracing::error!("{e}");
        cluster.tear_down();
        return Err(e);
    }
    cluster.state.ready = true;
    cluster.save();
    print!("{}", usage(&cluster.state));
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = hup.recv() => break,
            () = tokio::time::sleep(Duration::from_secs(1)) => {
                cluster.check();
            }
        }
    }
    cluster.tear_down();
    Ok(())
}

fn step(step: impl Into<String>) -> impl FnOnce(String) -> Error {
    let step = step.into();
    move |reason| Error::Step { step, reason }
}

/// Runs a short-lived helper (`tessera-sim create`, `tessera-cdi generate`)
/// to completion; killed if the bring-up is cancelled.
async fn helper(what: &str, cmd: &mut tokio::process::Command) -> Result<(), Error> {
    let out = cmd
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| step(what)(format!("could not start: {e}")))?;
    if out.status.success() {
        return Ok(());
    }
    Err(step(what)(format!(
        "{}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

async fn bring_up(cluster: &mut Cluster, args: &UpArgs) -> Result<(), Error> {
    let exe = std::env::current_exe().map_err(io(Path::new("/proc/self/exe")))?;
    let bin = exe.parent().unwrap_or(Path::new("/")).to_owned();
    let cdi_gen = bin.join("tessera-cdi");
    if !cdi_gen.is_file() {
        return Err(step("tessera-cdi")(format!(
            "{} is missing (build it: cargo build -p tessera-cdi)",
            cdi_gen.display()
        )));
    }
    let hook = match &args.hook_path {
        Some(h) => absolute(h, "--hook-path")?,
        None if bin.join("tessera-hook").is_file() => bin.join("tessera-hook"),
        None => PathBuf::from(tessera_model::contract::hook::BINARY_PATH),
    };
    if !hook.is_file() && args.runtime != Runtime::DryRun {
        tracing::warn!(hook = %hook.display(), "the hook the CDI specs name does not exist: containers asking for a GPU will fail");
    }
    let root = args.root.clone();

    // The API server, first: everything else talks to it.
    let kubeconfig = cluster.state.kubeconfig.clone();
    let _ = fs::remove_file(&kubeconfig);
    cluster.spawn(
        "apiserver",
        &exe,
        &[
            "apiserver".into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--kubeconfig-out".into(),
            kubeconfig.clone().into(),
            "--state".into(),
            root.join("apiserver.state").into(),
        ],
        None,
    )?;
    let client = wait_for_apiserver(cluster, &kubeconfig).await?;

    // The nodes.
    let image_archive = if args.runtime == Runtime::DryRun {
        None
    } else {
        let dir = match &args.image_dir {
            Some(d) => absolute(d, "--image-dir")?,
            None => root.join("images"),
        };
        Some(tokio::task::block_in_place(|| {
            image::busybox_archive(&dir)
        })?)
    };
    let probe_archive = match (&args.cuda_probe, &image_archive) {
        (Some(probe), Some(busybox)) => {
            let probe = absolute(probe, "--cuda-probe")?;
            let dir = busybox.path.parent().unwrap_or(&root).to_owned();
            Some(tokio::task::block_in_place(|| {
                image::cuda_probe_archive(&dir, &probe)
            })?)
        }
        _ => None,
    };
    if let (Runtime::Podman, Some(archive)) = (args.runtime, &image_archive) {
        tokio::task::block_in_place(|| image::load_into_podman(archive))?;
        if let Some(probe) = &probe_archive {
            tokio::task::block_in_place(|| {
                image::load_into_podman_as(probe, image::CUDA_PROBE_IMAGE)
            })?;
        }
    }
    let containerd_bin = args
        .containerd_bin_dir
        .clone()
        .unwrap_or_else(containerd::bin_dir_from_env);
    let profiles = args.node_profiles()?;
    for (i, profile) in (1..=args.nodes).zip(&profiles) {
        let name = format!("node-{i}");
        let dir = root.join("nodes").join(&name);
        fs::create_dir_all(&dir).map_err(io(&dir))?;
        helper(
            &format!("{name}: tessera-sim create"),
            tokio::process::Command::new(&exe)
                .args(["create", "--force", "--profile", profile, "--root"])
                .arg(&dir),
        )
        .await?;
        let cdi_dir = dir.join("cdi");
        fs::create_dir_all(&cdi_dir).map_err(io(&cdi_dir))?;
        let hook_config = write_hook_config(&dir, &cdi_dir)?;
        // --allow-empty, as the packaged refresh unit: a node whose every GPU
        // is in MIG mode with no instances gets no static spec, and every
        // device there comes from a device plugin's transient spec.
        helper(
            &format!("{name}: tessera-cdi generate"),
            tokio::process::Command::new(&cdi_gen)
                .arg("generate")
                .arg("--allow-empty")
                .arg("--driver-root")
                .arg(&dir)
                .arg("--hook-path")
                .arg(&hook)
                .arg("--hook-config")
                .arg(&hook_config)
                .arg("--output")
                .arg(cdi_dir.join(tessera_model::contract::cdi::STATIC_SPEC_FILE)),
        )
        .await?;
        let kubelet_dir = dir.join("var/lib/kubelet");
        let mut node = NodeState {
            name: name.clone(),
            dir: dir.clone(),
            device_plugin_dir: kubelet_dir.join("device-plugins"),
            kubelet_dir,
            cdi_dir: cdi_dir.clone(),
            containerd_dir: None,
            cri_endpoint: None,
        };
        if let (Runtime::Containerd, Some(archive)) = (args.runtime, &image_archive) {
            let dirs = DaemonDirs::new(&dir.join("containerd"));
            let options = Options {
                enable_cdi: !args.no_cdi,
                cdi_spec_dirs: vec![cdi_dir],
                ..Options::default()
            };
            let daemon = tokio::task::block_in_place(|| {
                let _ = fs::remove_dir_all(&dirs.base);
                let daemon = Daemon::start(
                    &containerd_bin,
                    dirs.clone(),
                    &options,
                    Duration::from_secs(30),
                )?;
                daemon.import_image(archive)?;
                if let Some(probe) = &probe_archive {
                    daemon.import_image_as(probe, image::CUDA_PROBE_IMAGE)?;
                }
                Ok::<_, Error>(daemon)
            })?;
            node.containerd_dir = Some(dirs.base.clone());
            node.cri_endpoint = Some(dirs.endpoint());
            cluster.daemons.push((name.clone(), daemon));
        }
        cluster.state.nodes.push(node);
        cluster.save();
    }

    // The scheduler.
    let scheduler_config = match &args.scheduler_config {
        Some(f) => absolute(f, "--scheduler-config")?,
        None => {
            let f = root.join("scheduler-config.yaml");
            fs::write(&f, DEFAULT_SCHEDULER_CONFIG).map_err(io(&f))?;
            f
        }
    };
    cluster.spawn(
        "scheduler",
        &exe,
        &[
            "scheduler".into(),
            "--config".into(),
            scheduler_config.into(),
            "--kubeconfig".into(),
            kubeconfig.clone().into(),
        ],
        None,
    )?;

    // The kubelets.
    for node in cluster.state.nodes.clone() {
        let mut kubelet_args: Vec<std::ffi::OsString> = vec![
            "kubelet".into(),
            "--node".into(),
            node.name.clone().into(),
            "--root".into(),
            node.dir.clone().into(),
            "--kubeconfig".into(),
            kubeconfig.clone().into(),
        ];
        if args.runtime != Runtime::DryRun {
            // Simulation only: the node root stands in for the kernel
            // driver every container of a real GPU node sees.
            kubelet_args.extend(["--sim-node-root".into(), node.dir.clone().into()]);
        }
        match (args.runtime, &node.cri_endpoint) {
            (Runtime::Containerd, Some(endpoint)) => {
                kubelet_args.extend(["--cri-endpoint".into(), endpoint.into()]);
            }
            (Runtime::Podman, _) => {
                kubelet_args.push("--podman".into());
                for arg in &args.podman_args {
                    kubelet_args.push(format!("--podman-arg={arg}").into());
                }
            }
            _ => {
                kubelet_args.extend([
                    "--dry-run".into(),
                    node.dir.join("cri-requests.jsonl").into(),
                ]);
            }
        }
        let socket = node.kubelet_dir.join("device-plugins/kubelet.sock");
        cluster.spawn(
            &format!("kubelet-{}", node.name),
            &exe,
            &kubelet_args,
            Some(socket.display().to_string()),
        )?;
    }

    wait_for_nodes(cluster, &client, args).await
}

/// Writes the node's own `hook.toml` (its CDI and state directories, not
/// the host's `/etc/tessera/hook.toml`), in a directory of its own with the
/// modes the hook trusts (0755 directory, 0644 file); returns its path.
fn write_hook_config(node_dir: &Path, cdi_dir: &Path) -> Result<PathBuf, Error> {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = node_dir.join("etc/tessera");
    fs::create_dir_all(&dir).map_err(io(&dir))?;
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).map_err(io(&dir))?;
    let path = dir.join("hook.toml");
    let quoted = |p: &Path| serde_json::Value::from(p.display().to_string()).to_string();
    let text = format!(
        "# Written by tessera-sim cluster up for this node.\ncdi_dir = {}\nstate_dir = {}\n",
        quoted(cdi_dir),
        quoted(&node_dir.join("var/lib/tessera")),
    );
    fs::write(&path, text).map_err(io(&path))?;
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).map_err(io(&path))?;
    Ok(path)
}

/// Waits for the kubeconfig the API server writes, then for `/version`.
async fn wait_for_apiserver(
    cluster: &mut Cluster,
    kubeconfig: &Path,
) -> Result<kube::Client, Error> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = String::from("it wrote no kubeconfig");
    while Instant::now() < deadline {
        if cluster.check() {
            break;
        }
        if kubeconfig.is_file() {
            match client(kubeconfig).await {
                Ok(c) => match tokio::time::timeout(REQUEST_TIMEOUT, c.apiserver_version())
                    .await
                    .unwrap_or_else(|_| Err(kube::Error::Service("no answer in 10 s".into())))
                {
                    Ok(_) => {
                        let url = server_url(kubeconfig);
                        if let Some(s) = cluster.services.iter_mut().find(|s| s.name == "apiserver")
                        {
                            s.socket = url;
                        }
                        cluster.save();
                        return Ok(c);
                    }
                    Err(e) => last = format!("/version: {e}"),
                },
                Err(e) => last = e,
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = cluster.state.root.join("logs/apiserver.log");
    Err(step("apiserver")(format!(
        "not serving: {last}; {}:\n{}",
        log.display(),
        containerd::tail(&log, 20)
    )))
}

/// The server URL of the first cluster a kubeconfig names.
pub fn server_url(kubeconfig: &Path) -> Option<String> {
    let config = kube::config::Kubeconfig::read_from(kubeconfig).ok()?;
    config.clusters.first()?.cluster.as_ref()?.server.clone()
}

/// A kube-rs client for a kubeconfig file.
pub async fn client(kubeconfig: &Path) -> Result<kube::Client, String> {
    let config = kube::config::Kubeconfig::read_from(kubeconfig)
        .map_err(|e| format!("{}: {e}", kubeconfig.display()))?;
    let config =
        kube::Config::from_custom_kubeconfig(config, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| format!("{}: {e}", kubeconfig.display()))?;
    kube::Client::try_from(config).map_err(|e| format!("kube client: {e}"))
}

/// Whether a node's `Ready` condition is `True`.
pub fn node_ready(node: &Node) -> bool {
    node_ready_since(node, i64::MIN)
}

/// Whether a node's `Ready` condition is `True` with a heartbeat at or
/// after `since` (seconds since the epoch): a Ready status kept in the API
/// server's state from an earlier run has an older heartbeat.
pub fn node_ready_since(node: &Node, since: i64) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.type_ == "Ready"
                    && c.status == "True"
                    && (since == i64::MIN
                        || c.last_heartbeat_time
                            .as_ref()
                            .is_some_and(|t| t.0.as_second() >= since))
            })
        })
}

/// Seconds since the epoch, now.
fn now_seconds() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// How long one request to the API server may take inside a wait loop.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

async fn wait_for_nodes(
    cluster: &mut Cluster,
    client: &kube::Client,
    args: &UpArgs,
) -> Result<(), Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let want: Vec<String> = cluster.state.nodes.iter().map(|n| n.name.clone()).collect();
    let deadline = Instant::now() + Duration::from_secs(args.ready_timeout);
    let since = cluster.started_at;
    let mut missing = want.clone();
    while Instant::now() < deadline {
        if cluster.check() {
            let dead: Vec<String> = cluster
                .services
                .iter()
                .filter(|s| s.dead_reported)
                .map(|s| format!("{} (log {})", s.name, s.log.display()))
                .collect();
            return Err(step("waiting for nodes")(format!(
                "exited: {}",
                dead.join(", ")
            )));
        }
        let listed = tokio::time::timeout(REQUEST_TIMEOUT, nodes.list(&ListParams::default()))
            .await
            .unwrap_or_else(|_| Err(kube::Error::Service("no answer in 10 s".into())));
        match listed {
            Ok(list) => {
                missing = want
                    .iter()
                    .filter(|w| {
                        !list.items.iter().any(|n| {
                            n.metadata.name.as_deref() == Some(w.as_str())
                                && node_ready_since(n, since)
                        })
                    })
                    .cloned()
                    .collect();
                if missing.is_empty() {
                    return Ok(());
                }
            }
            Err(e) => tracing::warn!("listing nodes: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(step("waiting for nodes")(format!(
        "not Ready after {} s: {}",
        args.ready_timeout,
        missing.join(", ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node_with_ready_heartbeat(at: &str) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "node-1"},
            "status": {"conditions": [{
                "type": "Ready", "status": "True",
                "lastHeartbeatTime": at, "lastTransitionTime": at,
            }]},
        }))
        .expect("a Node")
    }

    #[test]
    fn a_ready_status_from_before_up_does_not_count() {
        // 2026-01-01T00:00:00Z is 1767225600 s after the epoch.
        let node = node_with_ready_heartbeat("2026-01-01T00:00:00Z");
        assert!(node_ready(&node));
        assert!(node_ready_since(&node, 1_767_225_600));
        assert!(!node_ready_since(&node, 1_767_225_601), "a stale heartbeat");
        let no_heartbeat: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "node-1"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }))
        .expect("a Node");
        assert!(!node_ready_since(&no_heartbeat, 0));
        assert!(node_ready(&no_heartbeat));
    }

    #[test]
    fn a_huge_ready_timeout_is_refused_by_the_parser() {
        use clap::Parser as _;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            up: UpArgs,
        }
        let parse = |t: &str| Cli::try_parse_from(["up", "--root", "/x", "--ready-timeout", t]);
        assert!(parse("120").is_ok());
        assert!(parse("0").is_err());
        assert!(parse(&u64::MAX.to_string()).is_err());
    }

    fn up_args(nodes: u32, profile: &str) -> UpArgs {
        use clap::Parser as _;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            up: UpArgs,
        }
        let nodes = nodes.to_string();
        Cli::try_parse_from([
            "up",
            "--root",
            "/x",
            "--nodes",
            &nodes,
            "--profile",
            profile,
        ])
        .expect("valid arguments")
        .up
    }

    #[test]
    fn one_profile_is_every_nodes_and_a_list_gives_one_per_node() {
        assert_eq!(
            up_args(3, "dynamic").node_profiles().expect("one name"),
            ["dynamic", "dynamic", "dynamic"]
        );
        assert_eq!(
            up_args(2, "a100-40gb-dynamic, h100-80gb")
                .node_profiles()
                .expect("one per node"),
            ["a100-40gb-dynamic", "h100-80gb"]
        );
    }

    #[test]
    fn a_profile_list_of_the_wrong_length_or_with_a_gap_is_refused() {
        let err = up_args(3, "a,b").node_profiles().expect_err("2 for 3");
        assert_eq!(
            err.to_string(),
            "--profile: 2 profiles for 3 nodes: give one for every node or one per node"
        );
        let err = up_args(2, "a,").node_profiles().expect_err("empty name");
        assert!(err.to_string().starts_with("--profile: "), "{err}");
    }
}
