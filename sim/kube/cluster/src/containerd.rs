//! A private containerd 1.7 for one simulated node (or one test): its config
//! file, starting it, importing the busybox image, and taking it down with
//! everything it started — containers, shims, mounts.
//!
//! The daemon is containerd 1.7 from Debian trixie, unpacked by
//! `scripts/lib.sh` (`tessera_install_containerd`) under [`DEFAULT_BIN_DIR`]
//! (or `$TESSERA_CONTAINERD_BIN_DIR`), running containers with bookworm's
//! runc ([`RUNC`]). Every path it writes — root, state, runc root, sockets — is
//! below one base directory, never the system's `/run/containerd` (except the
//! shims' sockets: containerd 1.7 puts those in [`SHIM_SOCKET_DIR`] whatever
//! its config says, so they are removed by hand).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::image::{IMAGE, ImageArchive};
use crate::proc;

/// Where `tessera_install_containerd` (scripts/lib.sh) unpacks containerd 1.7's
/// binaries (`containerd`, `containerd-shim-runc-v2`, `ctr`).
pub const DEFAULT_BIN_DIR: &str = "/opt/tessera-e2e/containerd-1.7/usr/bin";

/// The environment variable naming another directory of containerd 1.7's binaries.
pub const BIN_DIR_ENV: &str = "TESSERA_CONTAINERD_BIN_DIR";

/// The OCI runtime the daemon's runc handler uses: bookworm's runc 1.1.5
/// (trixie's needs a newer glibc).
pub const RUNC: &str = "/usr/sbin/runc";

/// The CRI runtime handler the daemon configures (runc, `io.containerd.runc.v2`).
pub const RUNTIME_HANDLER: &str = "runc";

/// The containerd namespace of the CRI plugin.
pub const K8S_NAMESPACE: &str = "k8s.io";

/// Where containerd 1.7's shims put their sockets, whatever the daemon's
/// config says (`/run/containerd/s/<sha256 of address, namespace, id>`).
pub const SHIM_SOCKET_DIR: &str = "/run/containerd/s/";

/// The binaries of containerd 1.7 a daemon needs.
pub const BINARIES: [&str; 3] = ["containerd", "containerd-shim-runc-v2", "ctr"];

/// What went wrong with a private containerd.
#[derive(Debug, thiserror::Error)]
pub enum ContainerdError {
    /// A file or directory of the daemon could not be written or read.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A program could not be started.
    #[error("starting {program}: {source}")]
    Spawn {
        /// The program.
        program: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A program ran and failed.
    #[error("{what} failed ({status}): {output}")]
    Failed {
        /// What was run.
        what: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// The end of what it printed.
        output: String,
    },
    /// The daemon exited or did not answer in time.
    #[error("containerd ({socket}) {reason}; log {log}:\n{tail}")]
    NotServing {
        /// Its socket.
        socket: PathBuf,
        /// What happened.
        reason: String,
        /// Its log file.
        log: PathBuf,
        /// The end of its log.
        tail: String,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ContainerdError + '_ {
    move |source| ContainerdError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The directory holding containerd 1.7's binaries:
/// `$TESSERA_CONTAINERD_BIN_DIR` or [`DEFAULT_BIN_DIR`].
pub fn bin_dir_from_env() -> PathBuf {
    std::env::var_os(BIN_DIR_ENV)
        .filter(|d| !d.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_BIN_DIR), PathBuf::from)
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

/// A TOML basic string (JSON's escaping is a subset TOML reads the same).
fn toml_str(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

fn toml_path(p: &Path) -> String {
    toml_str(&p.display().to_string())
}

fn toml_list<S: AsRef<str>>(items: &[S]) -> String {
    let items: Vec<String> = items.iter().map(|s| toml_str(s.as_ref())).collect();
    format!("[{}]", items.join(", "))
}

impl Options {
    /// The daemon's config file (version 2) for a daemon living in `dirs`.
    pub fn config_toml(&self, dirs: &DaemonDirs) -> String {
        let cdi_dirs: Vec<String> = self
            .cdi_spec_dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect();
        let base_spec = self
            .base_runtime_spec
            .as_ref()
            .map(|p| format!("      base_runtime_spec = {}\n", toml_path(p)))
            .unwrap_or_default();
        let cri = r#"plugins."io.containerd.grpc.v1.cri""#;
        format!(
            r#"# Written by tessera-sim (sim/kube/cluster/src/containerd.rs): a private containerd.
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
  # Machines that forbid lowering oom_score_adj make runc fail with
  # "can't get final child's PID from pipe" without this.
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
            root = toml_path(&dirs.root),
            state = toml_path(&dirs.state),
            socket = toml_path(&dirs.socket),
            ttrpc = toml_str(&format!("{}.ttrpc", dirs.socket.display())),
            image = toml_str(IMAGE),
            enable_cdi = self.enable_cdi,
            cdi_dirs = toml_list(&cdi_dirs),
            handler = toml_str(RUNTIME_HANDLER),
            handler_key = RUNTIME_HANDLER,
            container_annotations = toml_list(&self.container_annotations),
            pod_annotations = toml_list(&self.pod_annotations),
            runc = toml_str(RUNC),
            runc_root = toml_path(&dirs.runc_root),
            cni_bin = toml_path(&dirs.base.join("cni/bin")),
            cni_conf = toml_path(&dirs.base.join("cni/net.d")),
        )
    }
}

/// The places one daemon owns, all below its base directory.
#[derive(Debug, Clone)]
pub struct DaemonDirs {
    /// The base directory.
    pub base: PathBuf,
    /// containerd's `root` (content, snapshots, CRI's sandbox files).
    pub root: PathBuf,
    /// containerd's `state` (task bundles, the containers' rootfs mounts).
    pub state: PathBuf,
    /// The runc handler's runc `--root` (the shim adds the namespace).
    pub runc_root: PathBuf,
    /// The gRPC socket.
    pub socket: PathBuf,
}

impl DaemonDirs {
    /// The layout below `base`.
    pub fn new(base: &Path) -> Self {
        Self {
            base: base.to_owned(),
            root: base.join("root"),
            state: base.join("state"),
            runc_root: base.join("runc"),
            socket: base.join("containerd.sock"),
        }
    }

    /// The daemon's config file.
    pub fn config(&self) -> PathBuf {
        self.base.join("config.toml")
    }

    /// The daemon's log file.
    pub fn log(&self) -> PathBuf {
        self.base.join("containerd.log")
    }

    /// The CRI endpoint as kubelet's `--container-runtime-endpoint` names it.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
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

/// A running private containerd; taken down (with everything it started) on
/// drop or by [`Daemon::shut_down`].
#[derive(Debug)]
pub struct Daemon {
    dirs: DaemonDirs,
    bin_dir: PathBuf,
    child: Option<Child>,
}

impl Daemon {
    /// Writes the config for `options`, starts the daemon from `bin_dir`
    /// with its log at [`DaemonDirs::log`] and waits until it serves on its
    /// socket (`ctr version` answers) or `timeout` passes.
    pub fn start(
        bin_dir: &Path,
        dirs: DaemonDirs,
        options: &Options,
        timeout: Duration,
    ) -> Result<Self, ContainerdError> {
        for d in [&dirs.root, &dirs.state, &dirs.runc_root] {
            fs::create_dir_all(d).map_err(io(d))?;
        }
        let tmp = dirs.base.join("tmp");
        fs::create_dir_all(&tmp).map_err(io(&tmp))?;
        let config = dirs.config();
        fs::write(&config, options.config_toml(&dirs)).map_err(io(&config))?;
        let log_path = dirs.log();
        let log = fs::File::create(&log_path).map_err(io(&log_path))?;
        let log2 = log.try_clone().map_err(io(&log_path))?;
        let program = bin_dir.join("containerd");
        let path = format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", bin_dir.display());
        // Its own process group: a Ctrl-C meant for whoever started it must
        // not kill it before its containers are stopped.
        let child = std::os::unix::process::CommandExt::process_group(
            Command::new(&program)
                .arg("--config")
                .arg(&config)
                .env_clear()
                .env("PATH", &path)
                .env("TMPDIR", &tmp)
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(log2),
            0,
        )
        .spawn()
        .map_err(|source| ContainerdError::Spawn { program, source })?;
        tracing::info!(socket = %dirs.socket.display(), pid = child.id(), "containerd started");
        // From here on a failure takes the daemon down (Drop).
        let mut daemon = Self {
            dirs,
            bin_dir: bin_dir.to_owned(),
            child: Some(child),
        };
        daemon.wait_until_serving(timeout)?;
        Ok(daemon)
    }

    fn wait_until_serving(&mut self, timeout: Duration) -> Result<(), ContainerdError> {
        let deadline = Instant::now() + timeout;
        let mut last = "did not create its socket".to_owned();
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(self.not_serving(format!("exited with {status} while starting")));
            }
            if self.dirs.socket.exists() {
                match self.ctr(&["version"]) {
                    Ok(()) => return Ok(()),
                    Err(e) => last = e.to_string(),
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(self.not_serving(format!("did not answer within {timeout:?}: {last}")))
    }

    fn not_serving(&self, reason: String) -> ContainerdError {
        ContainerdError::NotServing {
            socket: self.dirs.socket.clone(),
            reason,
            log: self.dirs.log(),
            tail: tail(&self.dirs.log(), 20),
        }
    }

    /// Runs `ctr --address <socket> -n k8s.io <args>`.
    fn ctr(&self, args: &[&str]) -> Result<(), ContainerdError> {
        let mut cmd = Command::new(self.bin_dir.join("ctr"));
        // ctr waits forever on a daemon that accepts but never answers.
        cmd.arg("--address")
            .arg(&self.dirs.socket)
            .args(["--connect-timeout", "10s", "--timeout", "120s"])
            .args(["-n", K8S_NAMESPACE])
            .args(args);
        run(&mut cmd, &format!("ctr {}", args.join(" ")))
    }

    /// Imports the image archive and tags the image [`IMAGE`] (the image of
    /// pods and the sandbox image).
    pub fn import_image(&self, archive: &ImageArchive) -> Result<(), ContainerdError> {
        self.import_image_as(archive, IMAGE)
    }

    /// Imports the image archive and tags the image `name` (e.g.
    /// [`crate::image::CUDA_PROBE_IMAGE`]).
    pub fn import_image_as(
        &self,
        archive: &ImageArchive,
        name: &str,
    ) -> Result<(), ContainerdError> {
        let path = archive.path.display().to_string();
        self.ctr(&["images", "import", "--snapshotter", "native", &path])?;
        self.ctr(&["images", "tag", "--force", &archive.name, name])
    }

    /// The daemon's directories.
    pub fn dirs(&self) -> &DaemonDirs {
        &self.dirs
    }

    /// The daemon's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the daemon process is still running.
    pub fn alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Takes everything down: containers runc still knows of, shims and
    /// their children, the daemon, the shims' sockets, and mounts left below
    /// the base directory. Best effort; what failed is logged.
    pub fn shut_down(&mut self) {
        // A daemon already reaped (by `alive`) has no pid to signal any more:
        // it may be someone else's now.
        let pid = self.child.as_mut().and_then(|c| match c.try_wait() {
            Ok(None) => i32::try_from(c.id()).ok(),
            _ => None,
        });
        tear_down(&self.dirs, pid);
        if let Some(mut child) = self.child.take() {
            if matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
            }
            let _ = child.wait();
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.shut_down();
        }
    }
}

/// Takes down a daemon living in `dirs` (whose pid is `daemon`, if known;
/// else found by its config path on a command line): its containers (runc
/// `delete --force`), its shims and their children, the daemon itself
/// (SIGTERM, then SIGKILL), the shims' sockets, and every mount below
/// `dirs.base` (not `dirs.base` itself). Only processes whose program is a
/// containerd shim naming the daemon's socket, or `containerd` naming its
/// config, are looked for. Works whether or not the process that started it is alive.
pub fn tear_down(dirs: &DaemonDirs, daemon: Option<i32>) {
    // Containers runc still knows of: `delete --force` kills their
    // processes and removes their cgroups.
    let runc_root = dirs.runc_root.join(K8S_NAMESPACE);
    if let Ok(entries) = fs::read_dir(&runc_root) {
        for entry in entries.flatten() {
            let _ = Command::new(RUNC)
                .arg("--root")
                .arg(&runc_root)
                .args(["delete", "--force"])
                .arg(entry.file_name())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
    // Shims (their command line names this daemon's socket) and everything
    // below them.
    let shims = proc::processes_with_arg(&dirs.socket.display().to_string(), proc::is_shim);
    let doomed = proc::with_descendants(&shims);
    let shim_sockets = sockets_of(&shims, SHIM_SOCKET_DIR);
    let daemons = match daemon {
        Some(pid) => vec![pid],
        None => proc::processes_with_arg(&dirs.config().display().to_string(), |name| {
            name == "containerd"
        }),
    };
    for pid in &daemons {
        proc::signal(*pid, rustix::process::Signal::TERM);
    }
    proc::wait_gone(&daemons, Duration::from_secs(5));
    for pid in daemons.iter().chain(doomed.iter().rev()) {
        proc::signal(*pid, rustix::process::Signal::KILL);
    }
    proc::wait_gone(&doomed, Duration::from_secs(5));
    // A shim removes its socket when it exits, not when it is killed.
    for socket in shim_sockets {
        let _ = fs::remove_file(socket);
    }
    let base = &dirs.base;
    proc::unmount(
        proc::mounts_under(base)
            .into_iter()
            .filter(|m| m != base)
            .collect(),
    );
}

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

/// Removes the (empty) cgroup directories `parent` and below in every cgroup
/// hierarchy, deepest first, then those of `parent`'s ancestors that are
/// left empty. Only `rmdir`: a cgroup still holding a process (or another
/// cgroup) stays.
pub fn remove_cgroups(parent: &str) {
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
                tracing::warn!(cgroup = %dir.display(), "rmdir: {e}");
            }
        }
        let mut ancestor = Path::new(parent.trim_start_matches('/')).parent();
        while let Some(dir) = ancestor.filter(|d| !d.as_os_str().is_empty()) {
            let _ = fs::remove_dir(Path::new(hierarchy).join(dir));
            ancestor = dir.parent();
        }
    }
}

/// Runs a command to completion; a failure carries the end of its output.
pub(crate) fn run(cmd: &mut Command, what: &str) -> Result<(), ContainerdError> {
    let program = PathBuf::from(cmd.get_program());
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|source| ContainerdError::Spawn { program, source })?;
    if out.status.success() {
        return Ok(());
    }
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Err(ContainerdError::Failed {
        what: what.to_owned(),
        status: out.status,
        output: last_lines(text.trim(), 5).join(" | "),
    })
}

fn last_lines(text: &str, lines: usize) -> Vec<&str> {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].to_vec()
}

/// The last `lines` lines of a text file.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    last_lines(&text, lines).join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_is_toml_with_everything_below_the_base_and_cdi_on_the_node_dir() {
        let dirs = DaemonDirs::new(Path::new("/x/node \"1\"/containerd"));
        let options = Options {
            enable_cdi: true,
            cdi_spec_dirs: vec![PathBuf::from("/x/node-1/cdi")],
            container_annotations: vec!["cdi.k8s.io/".into()],
            ..Options::default()
        };
        let text = options.config_toml(&dirs);
        let config: toml::Table = toml::from_str(&text).expect("valid TOML");
        assert_eq!(config["version"].as_integer(), Some(2));
        assert_eq!(
            config["root"].as_str(),
            Some("/x/node \"1\"/containerd/root")
        );
        assert_eq!(
            config["state"].as_str(),
            Some("/x/node \"1\"/containerd/state")
        );
        assert_eq!(
            config["grpc"]["address"].as_str(),
            Some("/x/node \"1\"/containerd/containerd.sock")
        );
        let cri = &config["plugins"]["io.containerd.grpc.v1.cri"];
        assert_eq!(cri["enable_cdi"].as_bool(), Some(true));
        assert_eq!(
            cri["cdi_spec_dirs"].as_array().map(Vec::len),
            Some(1),
            "{text}"
        );
        assert_eq!(cri["cdi_spec_dirs"][0].as_str(), Some("/x/node-1/cdi"));
        assert_eq!(cri["sandbox_image"].as_str(), Some(IMAGE));
        assert_eq!(cri["restrict_oom_score_adj"].as_bool(), Some(true));
        assert_eq!(cri["containerd"]["snapshotter"].as_str(), Some("native"));
        let runc = &cri["containerd"]["runtimes"]["runc"];
        assert_eq!(runc["runtime_type"].as_str(), Some("io.containerd.runc.v2"));
        assert_eq!(
            runc["container_annotations"][0].as_str(),
            Some("cdi.k8s.io/")
        );
        assert!(runc.get("base_runtime_spec").is_none());
        assert_eq!(
            runc["options"]["BinaryName"].as_str(),
            Some("/usr/sbin/runc")
        );
        assert_eq!(
            runc["options"]["Root"].as_str(),
            Some("/x/node \"1\"/containerd/runc")
        );
    }

    #[test]
    fn a_failing_command_says_what_and_ends_with_its_last_lines() {
        let err = run(
            Command::new("sh").args(["-c", "for i in 1 2 3 4 5 6 7; do echo line$i; done; exit 3"]),
            "counting",
        )
        .expect_err("exit 3");
        let text = err.to_string();
        assert!(text.starts_with("counting failed"), "{text}");
        assert!(
            text.contains("line3 | line4 | line5 | line6 | line7"),
            "{text}"
        );
        assert!(!text.contains("line2"), "{text}");
    }
}
