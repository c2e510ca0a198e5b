//! [`ContainerRuntime`] on podman's command line, for machines without a CRI
//! runtime: a podman pod per sandbox, `podman create --pod` per container,
//! CDI devices as `--device vendor/class=name`. Names follow kubelet's
//! docker-era scheme, `k8s_<container>_<pod>_<namespace>_<uid>_<attempt>`.

use std::collections::BTreeMap;

use serde_json::Value;
use tokio::process::Command;

use super::{
    ContainerConfig, ContainerInfo, ContainerRuntime, ContainerState, ContainerStatus,
    PidNamespace, RuntimeError, RuntimeResult, RuntimeVersion, SandboxConfig, SandboxInfo, labels,
};

/// Label a podman pod carries with its sandbox attempt.
const ATTEMPT_LABEL: &str = "io.tessera.sandbox.attempt";
/// Label a podman container carries with its attempt.
const CONTAINER_ATTEMPT_LABEL: &str = "io.tessera.container.attempt";

/// The podman runtime.
#[derive(Debug, Clone)]
pub struct PodmanRuntime {
    program: String,
    create_args: Vec<String>,
}

impl PodmanRuntime {
    /// `podman` from `PATH`; `create_args` go to every `podman create`
    /// (`--runtime=/usr/sbin/runc`, `--ulimit=nofile=4096:4096` where the
    /// machine needs them).
    pub fn new(create_args: Vec<String>) -> PodmanRuntime {
        PodmanRuntime {
            program: "podman".to_owned(),
            create_args,
        }
    }

    async fn podman(&self, call: &'static str, args: &[String]) -> RuntimeResult<String> {
        tracing::debug!(call, ?args, "podman");
        let output = Command::new(&self.program)
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .await
            .map_err(|e| RuntimeError::Connect {
                endpoint: self.program.clone(),
                message: e.to_string(),
            })?;
        if output.status.success() {
            return Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned());
        }
        let message = String::from_utf8_lossy(&output.stderr).trim().to_owned();
        if message.contains("no such") || message.contains("no container with") {
            Err(RuntimeError::NotFound { call, message })
        } else {
            Err(RuntimeError::Call { call, message })
        }
    }
}

fn label_args(labels: &BTreeMap<String, String>) -> Vec<String> {
    labels
        .iter()
        .flat_map(|(k, v)| ["--label".to_owned(), format!("{k}={v}")])
        .collect()
}

/// The objects of a `podman ... --format json` listing; none for output
/// that is not a JSON array.
fn json_list(out: &str) -> Vec<Value> {
    match serde_json::from_str(out) {
        Ok(Value::Array(items)) => items,
        _ => Vec::new(),
    }
}

/// The attempt a podman object's `labels` record under `key`, 0 without one.
fn attempt(labels: &Value, key: &str) -> u32 {
    labels[key]
        .as_str()
        .and_then(|a| a.parse().ok())
        .unwrap_or(0)
}

fn parse_time_ns(text: &str) -> i64 {
    use k8s_openapi::jiff::Timestamp;
    if text.is_empty() || text.starts_with("0001-") {
        return 0;
    }
    // `podman inspect` prints RFC 3339; a value that does not parse counts
    // as "set, just now", which is all the pod status needs.
    let parsed = text
        .parse::<Timestamp>()
        .unwrap_or_else(|_| Timestamp::now());
    i64::try_from(parsed.as_nanosecond()).unwrap_or(i64::MAX)
}

#[tonic::async_trait]
impl ContainerRuntime for PodmanRuntime {
    async fn version(&self) -> RuntimeResult<RuntimeVersion> {
        let out = self
            .podman(
                "Version",
                &[
                    "version".into(),
                    "--format".into(),
                    "{{.Client.Version}}".into(),
                ],
            )
            .await?;
        Ok(RuntimeVersion {
            name: "podman".to_owned(),
            version: out,
        })
    }

    async fn run_sandbox(&self, config: &SandboxConfig) -> RuntimeResult<String> {
        let mut labels = config.labels.clone();
        labels.insert(ATTEMPT_LABEL.to_owned(), config.attempt.to_string());
        let mut args = vec![
            "pod".to_owned(),
            "create".to_owned(),
            "--name".to_owned(),
            format!(
                "k8s_POD_{}_{}_{}_{}",
                config.name, config.namespace, config.uid, config.attempt
            ),
            "--infra=false".to_owned(),
        ];
        args.extend(label_args(&labels));
        let id = self.podman("RunPodSandbox", &args).await?;
        Ok(id)
    }

    async fn sandbox_ip(&self, _id: &str) -> RuntimeResult<Option<String>> {
        // Containers run on the host's network here.
        Ok(None)
    }

    async fn stop_sandbox(&self, id: &str) -> RuntimeResult<()> {
        self.podman("StopPodSandbox", &["pod".into(), "stop".into(), id.into()])
            .await?;
        Ok(())
    }

    async fn remove_sandbox(&self, id: &str) -> RuntimeResult<()> {
        self.podman(
            "RemovePodSandbox",
            &["pod".into(), "rm".into(), "-f".into(), id.into()],
        )
        .await?;
        Ok(())
    }

    async fn image_present(&self, image: &str) -> RuntimeResult<bool> {
        match self
            .podman(
                "ImageStatus",
                &["image".into(), "exists".into(), image.into()],
            )
            .await
        {
            Ok(_) => Ok(true),
            Err(RuntimeError::Call { .. } | RuntimeError::NotFound { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        sandbox: &SandboxConfig,
        config: &ContainerConfig,
    ) -> RuntimeResult<String> {
        let mut labels = config.labels.clone();
        labels.insert(
            CONTAINER_ATTEMPT_LABEL.to_owned(),
            config.attempt.to_string(),
        );
        let mut args = vec![
            "create".to_owned(),
            "--pod".to_owned(),
            sandbox_id.to_owned(),
            "--name".to_owned(),
            format!(
                "k8s_{}_{}_{}_{}_{}",
                config.name, sandbox.name, sandbox.namespace, sandbox.uid, config.attempt
            ),
            "--network".to_owned(),
            "host".to_owned(),
        ];
        args.extend(self.create_args.iter().cloned());
        // A pod without an infra container has no namespace to share:
        // `shareProcessNamespace` is not honoured here, the host's are.
        if sandbox.pid == PidNamespace::Node {
            args.push("--pid=host".to_owned());
        }
        if sandbox.host_ipc {
            args.push("--ipc=host".to_owned());
        }
        args.extend(label_args(&labels));
        for (k, v) in &config.envs {
            args.push("--env".to_owned());
            args.push(format!("{k}={v}"));
        }
        for (k, v) in &config.annotations {
            args.push("--annotation".to_owned());
            args.push(format!("{k}={v}"));
        }
        for name in &config.cdi_devices {
            args.push("--device".to_owned());
            args.push(name.clone());
        }
        for d in &config.devices {
            args.push("--device".to_owned());
            args.push(format!(
                "{}:{}:{}",
                d.host_path, d.container_path, d.permissions
            ));
        }
        for m in &config.mounts {
            args.push("--volume".to_owned());
            let ro = if m.readonly { ":ro" } else { "" };
            args.push(format!("{}:{}{ro}", m.host_path, m.container_path));
        }
        if !config.working_dir.is_empty() {
            args.push("--workdir".to_owned());
            args.push(config.working_dir.clone());
        }
        if !config.command.is_empty() {
            args.push("--entrypoint".to_owned());
            args.push(serde_json::to_string(&config.command).unwrap_or_default());
        }
        args.push(config.image.clone());
        args.extend(config.args.iter().cloned());
        self.podman("CreateContainer", &args).await
    }

    async fn start_container(&self, id: &str) -> RuntimeResult<()> {
        self.podman("StartContainer", &["start".into(), id.into()])
            .await?;
        Ok(())
    }

    async fn stop_container(&self, id: &str, timeout: i64) -> RuntimeResult<()> {
        self.podman(
            "StopContainer",
            &[
                "stop".into(),
                "-t".into(),
                timeout.max(0).to_string(),
                id.into(),
            ],
        )
        .await?;
        Ok(())
    }

    async fn remove_container(&self, id: &str) -> RuntimeResult<()> {
        self.podman("RemoveContainer", &["rm".into(), "-f".into(), id.into()])
            .await?;
        Ok(())
    }

    async fn container_status(&self, id: &str) -> RuntimeResult<ContainerStatus> {
        let out = self
            .podman(
                "ContainerStatus",
                &[
                    "inspect".into(),
                    "--type".into(),
                    "container".into(),
                    id.into(),
                ],
            )
            .await?;
        let parsed: Value = serde_json::from_str(&out).map_err(|e| RuntimeError::Call {
            call: "ContainerStatus",
            message: format!("podman inspect {id}: {e}"),
        })?;
        let c = &parsed[0];
        let s = &c["State"];
        let state = match s["Status"].as_str().unwrap_or_default() {
            "created" | "configured" | "initialized" => ContainerState::Created,
            "running" | "paused" | "stopping" => ContainerState::Running,
            "exited" | "stopped" => ContainerState::Exited,
            _ => ContainerState::Unknown,
        };
        let exit_code = i32::try_from(s["ExitCode"].as_i64().unwrap_or(0)).unwrap_or(-1);
        let reason = if state != ContainerState::Exited {
            String::new()
        } else if s["OOMKilled"].as_bool() == Some(true) {
            "OOMKilled".to_owned()
        } else if exit_code == 0 {
            "Completed".to_owned()
        } else {
            "Error".to_owned()
        };
        Ok(ContainerStatus {
            id: c["Id"].as_str().unwrap_or(id).to_owned(),
            state,
            created_at: parse_time_ns(c["Created"].as_str().unwrap_or_default()),
            started_at: parse_time_ns(s["StartedAt"].as_str().unwrap_or_default()),
            finished_at: parse_time_ns(s["FinishedAt"].as_str().unwrap_or_default()),
            exit_code,
            reason,
            message: s["Error"].as_str().unwrap_or_default().to_owned(),
            image_ref: c["Image"].as_str().unwrap_or_default().to_owned(),
        })
    }

    async fn list_sandboxes(&self) -> RuntimeResult<Vec<SandboxInfo>> {
        let out = self
            .podman(
                "ListPodSandbox",
                &["pod".into(), "ps".into(), "--format".into(), "json".into()],
            )
            .await?;
        Ok(json_list(&out)
            .iter()
            .filter_map(|p| {
                let labels = &p["Labels"];
                Some(SandboxInfo {
                    id: p["Id"].as_str()?.to_owned(),
                    pod_uid: labels[labels::POD_UID].as_str()?.to_owned(),
                    node: labels[labels::NODE].as_str().unwrap_or_default().to_owned(),
                    ready: p["Status"].as_str() != Some("Exited"),
                    attempt: attempt(labels, ATTEMPT_LABEL),
                })
            })
            .collect())
    }

    async fn list_containers(&self) -> RuntimeResult<Vec<ContainerInfo>> {
        let out = self
            .podman(
                "ListContainers",
                &[
                    "ps".into(),
                    "-a".into(),
                    "--format".into(),
                    "json".into(),
                    "--filter".into(),
                    format!("label={}", labels::POD_UID),
                ],
            )
            .await?;
        Ok(json_list(&out)
            .iter()
            .filter_map(|c| {
                let labels = &c["Labels"];
                let state = match c["State"].as_str().unwrap_or_default() {
                    "created" => ContainerState::Created,
                    "running" => ContainerState::Running,
                    "exited" | "stopped" => ContainerState::Exited,
                    _ => ContainerState::Unknown,
                };
                Some(ContainerInfo {
                    id: c["Id"].as_str()?.to_owned(),
                    sandbox_id: c["Pod"].as_str().unwrap_or_default().to_owned(),
                    pod_uid: labels[labels::POD_UID].as_str()?.to_owned(),
                    node: labels[labels::NODE].as_str().unwrap_or_default().to_owned(),
                    name: labels[labels::CONTAINER_NAME].as_str()?.to_owned(),
                    attempt: attempt(labels, CONTAINER_ATTEMPT_LABEL),
                    state,
                })
            })
            .collect())
    }
}
