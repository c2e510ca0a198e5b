//! `DIR/cluster.json`: what a running cluster is made of — the supervisor's
//! pid, each service's pid, socket and log, each node's directories — for
//! `cluster down` and `cluster status` (and for people).

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The file name of the state below the cluster's root.
pub const FILE: &str = "cluster.json";

/// A cluster's state file.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterState {
    /// The cluster's root directory.
    pub root: PathBuf,
    /// The process supervising the services (`cluster up`); `None` once it
    /// has taken them down.
    pub supervisor_pid: Option<u32>,
    /// The supervisor's start time (field 22 of `/proc/<pid>/stat`): its
    /// pid is trusted only while the process with that pid started then.
    pub supervisor_start_time: Option<u64>,
    /// Every node is Ready and the cluster can be used.
    pub ready: bool,
    /// The kubeconfig the API server wrote.
    pub kubeconfig: PathBuf,
    /// `containerd`, `podman` or `dry-run`.
    pub runtime: String,
    /// The services, in start order.
    pub services: Vec<ServiceState>,
    /// The nodes.
    pub nodes: Vec<NodeState>,
}

/// One long-running process of the cluster.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceState {
    /// `apiserver`, `scheduler`, `containerd-node-1`, `kubelet-node-1`, …
    pub name: String,
    /// Its pid.
    pub pid: u32,
    /// Its start time (field 22 of `/proc/<pid>/stat`): the pid is trusted
    /// only while the process with that pid started then.
    pub start_time: u64,
    /// The socket (or URL) it serves on, if any.
    pub socket: Option<String>,
    /// Its log file.
    pub log: PathBuf,
}

/// One simulated node.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeState {
    /// The node's name (`node-<i>`).
    pub name: String,
    /// Its root (the simulated GPU node, and the kubelet's `--root`).
    pub dir: PathBuf,
    /// The kubelet's directory (`<dir>/var/lib/kubelet`).
    pub kubelet_dir: PathBuf,
    /// Where device plugins put their sockets and find `kubelet.sock`.
    pub device_plugin_dir: PathBuf,
    /// The node's CDI spec directory (its static `tessera.io/gpu` spec).
    pub cdi_dir: PathBuf,
    /// Its containerd's directory, with the `containerd` runtime.
    pub containerd_dir: Option<PathBuf>,
    /// Its CRI endpoint (`unix://…`), with the `containerd` runtime.
    pub cri_endpoint: Option<String>,
}

/// What went wrong reading or writing the state.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// No state file: no cluster was brought up there.
    #[error("{0}: no cluster here (no {FILE}; run `tessera-sim cluster up` first)")]
    Missing(PathBuf),
    /// The file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not a cluster state.
    #[error("{path}: not a cluster state: {reason}")]
    Malformed {
        /// The path.
        path: PathBuf,
        /// What serde said.
        reason: String,
    },
}

/// Whether `name` is a node name `cluster up` gives (`node-<n>`): the only
/// names from the state file that are turned into paths.
pub fn valid_node_name(name: &str) -> bool {
    name.strip_prefix("node-")
        .is_some_and(|n| !n.is_empty() && n.len() <= 6 && n.bytes().all(|b| b.is_ascii_digit()))
}

impl ClusterState {
    /// Whether the supervisor recorded here is still running (its pid and
    /// start time match a live process).
    pub fn supervisor_running(&self) -> bool {
        match (self.supervisor_pid, self.supervisor_start_time) {
            (Some(pid), Some(start)) => crate::proc::is_running(pid, start),
            _ => false,
        }
    }

    /// The recorded services that are still running (pid and start time).
    pub fn running_services(&self) -> Vec<&ServiceState> {
        self.services
            .iter()
            .filter(|s| crate::proc::is_running(s.pid, s.start_time))
            .collect()
    }

    /// The state file of the cluster rooted at `root`.
    pub fn path(root: &Path) -> PathBuf {
        root.join(FILE)
    }

    /// Reads the state of the cluster rooted at `root`.
    pub fn read(root: &Path) -> Result<Self, StateError> {
        let path = Self::path(root);
        let text = match fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(StateError::Missing(root.to_owned()));
            }
            Err(source) => return Err(StateError::Io { path, source }),
        };
        serde_json::from_slice(&text).map_err(|e| StateError::Malformed {
            path,
            reason: e.to_string(),
        })
    }

    /// Writes the state atomically (temp file + rename).
    pub fn write(&self) -> Result<(), StateError> {
        let path = Self::path(&self.root);
        let tmp = path.with_extension("json.tmp");
        let text = serde_json::to_vec_pretty(self).map_err(|e| StateError::Malformed {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        fs::write(&tmp, text)
            .and_then(|()| fs::rename(&tmp, &path))
            .map_err(|source| StateError::Io { path, source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips_and_an_unknown_field_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = ClusterState {
            root: dir.path().to_owned(),
            supervisor_pid: Some(42),
            supervisor_start_time: Some(7),
            ready: true,
            kubeconfig: dir.path().join("kubeconfig"),
            runtime: "dry-run".into(),
            services: vec![ServiceState {
                name: "apiserver".into(),
                pid: 43,
                start_time: 8,
                socket: Some("http://127.0.0.1:1".into()),
                log: dir.path().join("logs/apiserver.log"),
            }],
            nodes: Vec::new(),
        };
        state.write().expect("write");
        assert_eq!(ClusterState::read(dir.path()).expect("read"), state);

        let text = fs::read_to_string(ClusterState::path(dir.path())).expect("text");
        assert!(text.contains("\"supervisorPid\": 42"), "{text}");
        fs::write(
            ClusterState::path(dir.path()),
            text.replacen("\"ready\"", "\"readdy\"", 1),
        )
        .expect("write");
        let err = ClusterState::read(dir.path()).expect_err("unknown field");
        assert!(err.to_string().contains("readdy"), "{err}");
    }

    #[test]
    fn only_node_n_names_are_node_names() {
        for ok in ["node-1", "node-2000"] {
            assert!(valid_node_name(ok), "{ok}");
        }
        for bad in [
            "node-",
            "node-1/../..",
            "../x",
            "node-1x",
            "/etc",
            "node--1",
            "x",
        ] {
            assert!(!valid_node_name(bad), "{bad}");
        }
    }

    #[test]
    fn a_recorded_pid_with_another_start_time_is_not_running() {
        let me = std::process::id();
        let start = crate::proc::start_time(i32::try_from(me).expect("pid")).expect("start");
        let mut state = ClusterState {
            supervisor_pid: Some(me),
            supervisor_start_time: Some(start),
            ..ClusterState::default()
        };
        assert!(state.supervisor_running());
        state.supervisor_start_time = Some(start + 1);
        assert!(!state.supervisor_running(), "a reused pid");
        state.services.push(ServiceState {
            name: "apiserver".into(),
            pid: me,
            start_time: start + 1,
            socket: None,
            log: PathBuf::new(),
        });
        assert!(state.running_services().is_empty());
        state.services[0].start_time = start;
        assert_eq!(state.running_services().len(), 1);
    }

    #[test]
    fn a_missing_state_says_there_is_no_cluster() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = ClusterState::read(dir.path()).expect_err("missing");
        assert!(err.to_string().contains("no cluster here"), "{err}");
    }
}
