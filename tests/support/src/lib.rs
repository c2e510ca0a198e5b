//! What every Tessera crate's tests share: the one prerequisite rule
//! ([`prereq`]), the workspace's build outputs ([`artefact`],
//! [`built_library`], [`hook_binary`]), one simulated node builder
//! ([`node::SimNode`]) and an independent reading of a node
//! ([`node::NodeView`]), busybox root filesystems and OCI bundles run by runc
//! and crun ([`rootfs`], [`oci`]), podman and the host CDI directory
//! ([`podman`]), and, with the `containerd` feature, a private containerd
//! driven over CRI ([`containerd`]), with the `kubelet` feature a fake
//! kubelet for device plugins ([`kubelet`]), and golden-file comparisons with
//! `TESSERA_BLESS` ([`golden`]).
//!
//! A dev-dependency only: no crate ships it.

pub mod elf;
pub mod golden;
pub mod node;
pub mod oci;
pub mod podman;
pub mod prereq;
pub mod rootfs;

#[cfg(feature = "containerd")]
pub mod containerd;
#[cfg(feature = "kube")]
pub mod kube;
#[cfg(feature = "kubelet")]
pub mod kubelet;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use anyhow::{Context, Result, bail};

pub use prereq::{Need, Skip, require};
/// Achieved device time on a simulated device's shared timeline, read
/// from the file's layout (the judge of the SM limiter tests: independent
/// of the NVML utilization the limiter reads).
pub use tessera_sim::timeline;

/// The cargo profile directory holding the workspace's build outputs
/// (`target/debug`): the test executable lives in its `deps/`.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(Path::parent)
        .expect("test executable in target/<profile>/deps")
        .to_owned()
}

/// Where a workspace build output is, if it was built: next to the test
/// executable in `target/<profile>/deps/` (where `cargo test` leaves a
/// cdylib it built for this run), or in `target/<profile>/`.
pub fn find_built(name: &str) -> Option<PathBuf> {
    let profile = target_dir();
    [profile.join("deps").join(name), profile.join(name)]
        .into_iter()
        .find(|p| p.is_file())
}

/// Path of a workspace build output; panics with the build command if it is
/// missing (a test that may run without it says so first with
/// [`Need::Built`]).
pub fn artefact(name: &str) -> PathBuf {
    let path = target_dir().join(name);
    assert!(
        path.exists(),
        "{} is missing: build the workspace first (cargo build --workspace)",
        path.display()
    );
    path
}

/// A cdylib of the workspace ([`find_built`]); panics with the build command
/// if it is missing.
pub fn built_library(name: &str) -> PathBuf {
    find_built(name).unwrap_or_else(|| {
        panic!(
            "{name} is missing from {}: build the workspace first (cargo build --workspace)",
            target_dir().display()
        )
    })
}

/// The statically linked `tessera-hook` of this profile, built once per test
/// process with `hook/scripts/build-static.sh` (cargo does nothing when it is
/// fresh), or `$TESSERA_HOOK_BIN`.
pub fn hook_binary() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os("TESSERA_HOOK_BIN").filter(|b| !b.is_empty()) {
            return PathBuf::from(bin);
        }
        let profile = match target_dir().file_name().and_then(|n| n.to_str()) {
            Some("release") => "release",
            _ => "debug",
        };
        let script = workspace_root().join("hook/scripts/build-static.sh");
        let out = Command::new("bash")
            .arg(&script)
            .arg(profile)
            .env("CARGO", env!("CARGO"))
            .stderr(Stdio::inherit())
            .output()
            .expect("running hook/scripts/build-static.sh");
        assert!(
            out.status.success(),
            "{} {profile} failed",
            script.display()
        );
        let path = PathBuf::from(String::from_utf8(out.stdout).expect("utf-8 path").trim());
        assert!(path.is_file(), "{} was not built", path.display());
        path
    })
    .clone()
}

/// The workspace's root directory.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("tests/support sits two levels below the workspace root")
        .to_owned()
}

/// Runs a command, failing with its output when it exits non-zero.
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

/// Stops a child process as a service manager does: SIGTERM, then SIGKILL if
/// it has not exited within `grace`; reaps it either way.
pub fn terminate(mut child: std::process::Child, grace: std::time::Duration) {
    let pid = rustix::process::Pid::from_child(&child);
    let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    let deadline = std::time::Instant::now() + grace;
    while child.try_wait().ok().flatten().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago (for a server that
/// must keep its address across a restart).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on 127.0.0.1")
}
