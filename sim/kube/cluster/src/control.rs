//! `cluster down` and `cluster status`: act on a cluster from outside its
//! supervisor, through `DIR/cluster.json` and `/proc`.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};

use crate::Error;
use crate::containerd::{self, DaemonDirs};
use crate::proc;
use crate::state::{ClusterState, valid_node_name};
use crate::up;

/// Grace between SIGTERM and SIGKILL for services a dead supervisor left.
const SERVICE_GRACE: Duration = Duration::from_secs(10);

/// SIGTERM to `pids`, then SIGKILL to those still there after `grace`.
fn stop(pids: &[i32], grace: Duration) {
    for pid in pids {
        proc::signal(*pid, rustix::process::Signal::TERM);
    }
    if !proc::wait_gone(pids, grace) {
        for pid in pids {
            proc::signal(*pid, rustix::process::Signal::KILL);
        }
        proc::wait_gone(pids, Duration::from_secs(5));
    }
}

/// The nodes of a state, their paths rebuilt from `root` (never taken
/// from the file): names that are not `node-<n>` are skipped.
fn node_dirs(state: &ClusterState, root: &Path) -> Vec<(String, std::path::PathBuf)> {
    state
        .nodes
        .iter()
        .filter(|n| {
            let ok = valid_node_name(&n.name);
            if !ok {
                tracing::warn!(node = %n.name, "not a node name; ignored");
            }
            ok
        })
        .map(|n| (n.name.clone(), root.join("nodes").join(&n.name)))
        .collect()
}

/// Takes the cluster under `root` down: asks its supervisor (SIGTERM) and
/// waits for it (SIGKILL after [`up::SUPERVISOR_GRACE`]); then does what a
/// dead supervisor could not — its services still running (recorded pid
/// and start time) get SIGTERM then SIGKILL, containerd's containers and
/// shims are taken down, the API server last — and sweeps
/// ([`up::sweep`]). Fails if anything remains.
pub fn down(root: &Path) -> Result<(), Error> {
    let root = crate::canonical_root(root)?;
    let mut state = ClusterState::read(&root)?;
    // Written where it was read, whatever the file says.
    state.root.clone_from(&root);
    if state.supervisor_running()
        && let Some(pid) = state.supervisor_pid.and_then(|p| i32::try_from(p).ok())
    {
        proc::signal(pid, rustix::process::Signal::TERM);
        if !proc::wait_gone(&[pid], up::SUPERVISOR_GRACE) {
            tracing::warn!(pid, "the supervisor did not finish in time; killing it");
            proc::signal(pid, rustix::process::Signal::KILL);
            proc::wait_gone(&[pid], Duration::from_secs(5));
        }
    }
    // What a dead supervisor left: services whose pid and start time still
    // match (with their descendants), containerd's remains, the API server
    // last.
    let running = state.running_services();
    let pids_of = |apiserver: bool| -> Vec<i32> {
        let services: Vec<i32> = running
            .iter()
            .filter(|s| (s.name == "apiserver") == apiserver && !s.name.starts_with("containerd-"))
            .filter_map(|s| i32::try_from(s.pid).ok())
            .collect();
        proc::with_descendants(&services)
    };
    let daemon_pid = |node: &str| {
        running
            .iter()
            .find(|s| s.name == format!("containerd-{node}"))
            .and_then(|s| i32::try_from(s.pid).ok())
    };
    stop(&pids_of(false), SERVICE_GRACE);
    let nodes = node_dirs(&state, &root);
    if state.runtime == "podman" {
        for (name, _) in &nodes {
            up::remove_podman_pods(name);
        }
    }
    if state.runtime == "containerd" {
        for (name, dir) in &nodes {
            containerd::tear_down(&DaemonDirs::new(&dir.join("containerd")), daemon_pid(name));
        }
    }
    stop(&pids_of(true), SERVICE_GRACE);
    up::sweep(&root);
    state.supervisor_pid = None;
    state.supervisor_start_time = None;
    state.ready = false;
    state.services.clear();
    state.write()?;

    let processes = proc::leftovers_of(&root);
    let mounts = proc::mounts_below_nodes(&root);
    if !processes.is_empty() || !mounts.is_empty() {
        return Err(Error::LeftBehind {
            root,
            what: format!("processes {processes:?}, mounts {mounts:?}"),
        });
    }
    println!("cluster under {} is down", root.display());
    Ok(())
}

/// A report of the cluster under `root`: the supervisor, each service
/// (alive or not), each node (Ready or not, as the API server says).
pub fn status(root: &Path) -> Result<String, Error> {
    let root = crate::canonical_root(root)?;
    let mut state = ClusterState::read(&root)?;
    state.root.clone_from(&root);
    let mut out = String::new();
    let supervisor = match state.supervisor_pid {
        Some(pid) if state.supervisor_running() => format!("pid {pid}, alive"),
        Some(pid) => format!("pid {pid}, GONE"),
        None => "none (down)".to_owned(),
    };
    let _ = writeln!(
        out,
        "cluster {}: supervisor {supervisor}; ready: {}; runtime {}; kubeconfig {}",
        root.display(),
        if state.ready { "yes" } else { "no" },
        state.runtime,
        state.kubeconfig.display()
    );
    let _ = writeln!(out, "{:<24} {:>8} {:<6} SERVES", "SERVICE", "PID", "STATE");
    for s in &state.services {
        let _ = writeln!(
            out,
            "{:<24} {:>8} {:<6} {}",
            s.name,
            s.pid,
            if proc::is_running(s.pid, s.start_time) {
                "alive"
            } else {
                "GONE"
            },
            s.socket.as_deref().unwrap_or("-")
        );
    }
    let ready = node_readiness(&state);
    let _ = writeln!(out, "{:<24} {:<8} DIR", "NODE", "READY");
    for n in &state.nodes {
        let r = match &ready {
            Ok(nodes) => match nodes.iter().find(|(name, _)| *name == n.name) {
                Some((_, true)) => "True",
                Some((_, false)) => "False",
                None => "absent",
            },
            Err(_) => "unknown",
        };
        let _ = writeln!(out, "{:<24} {:<8} {}", n.name, r, n.dir.display());
    }
    if let Err(e) = ready {
        let _ = writeln!(out, "(node readiness unknown: {e})");
    }
    Ok(out)
}

/// Each node's name and readiness, from the API server (when it answers).
fn node_readiness(state: &ClusterState) -> Result<Vec<(String, bool)>, String> {
    let apiserver_alive = state
        .services
        .iter()
        .any(|s| s.name == "apiserver" && proc::is_running(s.pid, s.start_time));
    if !apiserver_alive {
        return Err("the API server is not running".into());
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let client = up::client(&state.root.join("kubeconfig")).await?;
        let nodes: Api<Node> = Api::all(client);
        let list =
            tokio::time::timeout(Duration::from_secs(10), nodes.list(&ListParams::default()))
                .await
                .map_err(|_| "no answer in 10 s".to_owned())?
                .map_err(|e| e.to_string())?;
        Ok(list
            .items
            .iter()
            .filter_map(|n| Some((n.metadata.name.clone()?, up::node_ready(n))))
            .collect())
    })
}
