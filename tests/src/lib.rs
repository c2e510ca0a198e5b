//! Support for Tessera's end-to-end tests: finding the built binaries, making
//! simulated nodes and busybox root filesystems, running podman, and holding
//! the host-wide CDI directory while a test uses it.

pub mod node;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{Context, Result, bail};

/// The cargo profile directory holding the binaries (`target/debug`): the test
/// executable lives in its `deps/`.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(Path::parent)
        .expect("test executable in target/<profile>/deps")
        .to_owned()
}

/// Path of a workspace artefact; panics with the build command if it is missing,
/// since a missing build output is a broken setup, not an absent feature.
pub fn artefact(name: &str) -> PathBuf {
    let path = target_dir().join(name);
    assert!(
        path.exists(),
        "{} is missing: build the workspace first (cargo test --workspace builds it)",
        path.display()
    );
    path
}

/// Runs a command, failing with its stderr when it exits non-zero.
pub fn run(cmd: &mut Command) -> Result<Output> {
    let out = cmd.output().with_context(|| format!("spawning {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} exited with {}:\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out)
}

/// Creates a simulated node from a shipped profile under `root`.
pub fn create_node(profile: &str, root: &Path) -> Result<()> {
    run(Command::new(artefact("tessera-sim"))
        .args(["create", "--profile", profile, "--root"])
        .arg(root))?;
    Ok(())
}

/// A busybox-static root filesystem with a few applet links.
pub fn busybox_rootfs(dir: &Path) -> Result<PathBuf> {
    let rootfs = dir.join("rootfs");
    fs::create_dir_all(rootfs.join("bin"))?;
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .context("busybox-static is not installed (apt-get install busybox-static)")?;
    fs::copy(busybox, rootfs.join("bin/busybox"))?;
    for applet in ["sh", "ls", "cat", "stat", "find", "echo", "touch", "head"] {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet))?;
    }
    Ok(rootfs)
}

/// Why an end-to-end test cannot run here, if it cannot: it needs root and
/// the named programs. Under CI (`CI` set) a missing prerequisite is a failure.
pub fn prerequisites(programs: &[&str]) -> Option<String> {
    let root = rustix::process::geteuid().is_root();
    let mut missing: Vec<String> = programs
        .iter()
        .filter(|p| which(p).is_none())
        .map(|p| format!("{p} not installed"))
        .collect();
    if !root {
        missing.push("not running as root".to_owned());
    }
    verdict(missing)
}

/// The skip reason for `missing` prerequisites (each naming what to install),
/// or `None` when nothing is missing; under CI (`CI` set) anything missing
/// fails the test instead.
pub fn verdict(missing: Vec<String>) -> Option<String> {
    if missing.is_empty() {
        return None;
    }
    let reason = missing.join(", ");
    assert!(
        std::env::var_os("CI").is_none(),
        "end-to-end prerequisites missing under CI: {reason}"
    );
    Some(reason)
}

/// Looks a program up in `PATH` and the sbin directories.
pub fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"])
        .map(|dir| Path::new(dir).join(program))
        .find(|p| p.is_file())
}

/// Exclusive use of the host's `/var/run/cdi/tessera.io-gpu.json` for the life
/// of the guard: podman reads specs only from the host's CDI directories, and
/// two specs of one kind with the same device names cancel each other out. The
/// guard saves any spec already there and puts it back on drop.
pub struct CdiSpecSlot {
    _lock: fs::File,
    path: PathBuf,
    saved: Option<Vec<u8>>,
}

impl CdiSpecSlot {
    /// Waits for the slot (an flock shared by all test processes).
    pub fn acquire() -> Result<Self> {
        let dir = Path::new("/var/run/cdi");
        fs::create_dir_all(dir)?;
        let lock = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open("/run/tessera-e2e-cdi.lock")?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
            .context("flock /run/tessera-e2e-cdi.lock")?;
        let path = dir.join("tessera.io-gpu.json");
        let saved = fs::read(&path).ok();
        Ok(Self {
            _lock: lock,
            path,
            saved,
        })
    }

    /// The spec path tests write to.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for CdiSpecSlot {
    fn drop(&mut self) {
        let _ = match &self.saved {
            Some(bytes) => fs::write(&self.path, bytes),
            None => fs::remove_file(&self.path),
        };
    }
}

/// A podman invocation with the settings these machines need: no network
/// (no CNI), and rlimits pinned because the sandbox forbids raising them.
/// `--rootfs` must be the last option: podman reads the command after its value.
pub fn podman(runtime: &str, devices: &[String], rootfs: &Path, script: &str) -> Command {
    let mut cmd = Command::new("podman");
    cmd.args([
        "run",
        "--rm",
        "--network",
        "none",
        "--runtime",
        runtime,
        "--ulimit",
        "nofile=4096:4096",
        "--ulimit",
        "nproc=4096:4096",
    ]);
    for device in devices {
        cmd.arg("--device").arg(format!("tessera.io/gpu={device}"));
    }
    cmd.arg("--rootfs")
        .arg(rootfs)
        .args(["/bin/sh", "-c", script]);
    cmd
}

pub mod containerd;
pub mod hookenv;
pub mod oci;
pub mod sentinel;
