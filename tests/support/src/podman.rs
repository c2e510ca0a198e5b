//! podman as the tests run it, and exclusive use of the host's CDI spec slot.

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

/// `podman [global] run` with the settings these machines need: no network
/// (no CNI), and rlimits pinned because the sandbox forbids raising them.
fn run_command(global: &[&OsStr], runtime: &str) -> Command {
    let mut cmd = Command::new("podman");
    cmd.args(global).args([
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
    cmd
}

/// `--rootfs` must be the last option: podman reads the command after its value.
fn finish(mut cmd: Command, rootfs: &Path, script: &str) -> Command {
    cmd.arg("--rootfs")
        .arg(rootfs)
        .args(["/bin/sh", "-c", script]);
    cmd
}

/// A `podman run` of `script` in `rootfs` under `runtime` with the CDI
/// devices `tessera.io/gpu=<device>`.
pub fn podman(runtime: &str, devices: &[String], rootfs: &Path, script: &str) -> Command {
    let mut cmd = run_command(&[], runtime);
    for device in devices {
        cmd.arg("--device").arg(format!("tessera.io/gpu={device}"));
    }
    finish(cmd, rootfs, script)
}

/// A `podman run` of `script` in `rootfs` with the hooks in `hooks_dir`,
/// `annotations` and `extra` options.
pub fn podman_with_hooks(
    runtime: &str,
    hooks_dir: &Path,
    annotations: &[(&str, &str)],
    extra: &[&OsStr],
    rootfs: &Path,
    script: &str,
) -> Command {
    let mut cmd = run_command(&[OsStr::new("--hooks-dir"), hooks_dir.as_os_str()], runtime);
    for (key, value) in annotations {
        cmd.arg("--annotation").arg(format!("{key}={value}"));
    }
    cmd.args(extra);
    finish(cmd, rootfs, script)
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
