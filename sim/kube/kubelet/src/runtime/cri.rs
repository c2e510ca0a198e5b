//! [`ContainerRuntime`] over CRI v1 (`runtime.v1`) on a unix socket, as
//! kubelet talks to containerd.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use tessera_kube_proto::cri;
use tessera_kube_proto::cri::image_service_client::ImageServiceClient;
use tessera_kube_proto::cri::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

use super::{
    ContainerConfig, ContainerInfo, ContainerRuntime, ContainerState, ContainerStatus,
    PidNamespace, RuntimeError, RuntimeResult, RuntimeVersion, SandboxConfig, SandboxInfo, labels,
};

/// How long one CRI call may take (StopContainer adds its grace period).
const CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// The runtime handler pods run with (containerd's default runc handler).
const RUNTIME_HANDLER: &str = "runc";

/// A CRI client on `unix:///path/to.sock`.
#[derive(Clone)]
pub struct CriRuntime {
    endpoint: String,
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
}

impl CriRuntime {
    /// Connects (lazily: a runtime that is not up yet is retried per call)
    /// to `endpoint`, `unix:///path` or a plain path.
    pub fn connect(endpoint: &str) -> RuntimeResult<CriRuntime> {
        let path = PathBuf::from(endpoint.strip_prefix("unix://").unwrap_or(endpoint));
        if !path.is_absolute() {
            return Err(RuntimeError::Connect {
                endpoint: endpoint.to_owned(),
                message: "--cri-endpoint: want unix:///absolute/path.sock".to_owned(),
            });
        }
        let channel = tessera_kube_proto::unix_channel_lazy(&path);
        Ok(CriRuntime {
            endpoint: endpoint.to_owned(),
            runtime: RuntimeServiceClient::new(channel.clone()),
            images: ImageServiceClient::new(channel),
        })
    }

    /// The endpoint it talks to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
}

fn status_error(call: &'static str, status: &tonic::Status) -> RuntimeError {
    if status.code() == tonic::Code::NotFound {
        RuntimeError::NotFound {
            call,
            message: status.message().to_owned(),
        }
    } else {
        RuntimeError::Call {
            call,
            message: status.message().to_owned(),
        }
    }
}

async fn bounded<T, F>(call: &'static str, extra: Duration, future: F) -> RuntimeResult<T>
where
    F: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    match tokio::time::timeout(CALL_TIMEOUT + extra, future).await {
        Err(_) => Err(RuntimeError::Call {
            call,
            message: format!("no answer within {:?}", CALL_TIMEOUT + extra),
        }),
        Ok(Err(status)) => Err(status_error(call, &status)),
        Ok(Ok(response)) => Ok(response.into_inner()),
    }
}

fn hash(map: &std::collections::BTreeMap<String, String>) -> HashMap<String, String> {
    map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// The CRI sandbox config kubelet sends: host network (no CNI here), a pid
/// namespace per container, an IPC namespace per pod.
pub fn sandbox_config(config: &SandboxConfig) -> cri::PodSandboxConfig {
    let namespaces = namespace_options(config);
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: config.name.clone(),
            uid: config.uid.clone(),
            namespace: config.namespace.clone(),
            attempt: config.attempt,
        }),
        hostname: config.hostname.clone(),
        log_directory: config.log_directory.clone(),
        labels: hash(&config.labels),
        annotations: hash(&config.annotations),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: config.cgroup_parent.clone(),
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(namespaces),
                readonly_rootfs: false,
                privileged: false,
            }),
            sysctls: HashMap::new(),
        }),
    }
}

fn namespace_options(sandbox: &SandboxConfig) -> cri::NamespaceOption {
    let pid = match sandbox.pid {
        PidNamespace::Container => cri::NamespaceMode::Container,
        PidNamespace::Pod => cri::NamespaceMode::Pod,
        PidNamespace::Node => cri::NamespaceMode::Node,
    };
    let ipc = if sandbox.host_ipc {
        cri::NamespaceMode::Node
    } else {
        cri::NamespaceMode::Pod
    };
    cri::NamespaceOption {
        network: cri::NamespaceMode::Node.into(),
        pid: pid.into(),
        ipc: ipc.into(),
        target_id: String::new(),
    }
}

/// The CRI container config kubelet sends (the sandbox's namespace options
/// repeated, as kubelet does).
pub fn container_config(config: &ContainerConfig, sandbox: &SandboxConfig) -> cri::ContainerConfig {
    cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: config.name.clone(),
            attempt: config.attempt,
        }),
        image: Some(cri::ImageSpec {
            image: config.image.clone(),
            user_specified_image: config.image.clone(),
            ..cri::ImageSpec::default()
        }),
        command: config.command.clone(),
        args: config.args.clone(),
        working_dir: config.working_dir.clone(),
        envs: config
            .envs
            .iter()
            .map(|(key, value)| cri::KeyValue {
                key: key.clone(),
                value: value.clone(),
            })
            .collect(),
        mounts: config
            .mounts
            .iter()
            .map(|m| cri::Mount {
                container_path: m.container_path.clone(),
                host_path: m.host_path.clone(),
                readonly: m.readonly,
                selinux_relabel: false,
            })
            .collect(),
        devices: config
            .devices
            .iter()
            .map(|d| cri::Device {
                container_path: d.container_path.clone(),
                host_path: d.host_path.clone(),
                permissions: d.permissions.clone(),
            })
            .collect(),
        labels: hash(&config.labels),
        annotations: hash(&config.annotations),
        log_path: config.log_path.clone(),
        linux: Some(cri::LinuxContainerConfig {
            security_context: Some(cri::LinuxContainerSecurityContext {
                privileged: false,
                namespace_options: Some(namespace_options(sandbox)),
                readonly_rootfs: false,
                no_new_privs: false,
            }),
        }),
        cdi_devices: config
            .cdi_devices
            .iter()
            .map(|name| cri::CdiDevice { name: name.clone() })
            .collect(),
    }
}

fn state(value: i32) -> ContainerState {
    match cri::ContainerState::try_from(value) {
        Ok(cri::ContainerState::ContainerCreated) => ContainerState::Created,
        Ok(cri::ContainerState::ContainerRunning) => ContainerState::Running,
        Ok(cri::ContainerState::ContainerExited) => ContainerState::Exited,
        _ => ContainerState::Unknown,
    }
}

#[tonic::async_trait]
impl ContainerRuntime for CriRuntime {
    async fn version(&self) -> RuntimeResult<RuntimeVersion> {
        let mut c = self.runtime.clone();
        let v = bounded(
            "Version",
            Duration::ZERO,
            c.version(cri::VersionRequest {
                version: "v1".to_owned(),
            }),
        )
        .await?;
        Ok(RuntimeVersion {
            name: v.runtime_name,
            version: v.runtime_version,
        })
    }

    async fn run_sandbox(&self, config: &SandboxConfig) -> RuntimeResult<String> {
        let mut c = self.runtime.clone();
        let request = cri::RunPodSandboxRequest {
            config: Some(sandbox_config(config)),
            runtime_handler: RUNTIME_HANDLER.to_owned(),
        };
        Ok(
            bounded("RunPodSandbox", Duration::ZERO, c.run_pod_sandbox(request))
                .await?
                .pod_sandbox_id,
        )
    }

    async fn sandbox_ip(&self, id: &str) -> RuntimeResult<Option<String>> {
        let mut c = self.runtime.clone();
        let response = bounded(
            "PodSandboxStatus",
            Duration::ZERO,
            c.pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: id.to_owned(),
                verbose: false,
            }),
        )
        .await?;
        Ok(response
            .status
            .and_then(|s| s.network)
            .map(|n| n.ip)
            .filter(|ip| !ip.is_empty()))
    }

    async fn stop_sandbox(&self, id: &str) -> RuntimeResult<()> {
        let mut c = self.runtime.clone();
        bounded(
            "StopPodSandbox",
            Duration::ZERO,
            c.stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: id.to_owned(),
            }),
        )
        .await?;
        Ok(())
    }

    async fn remove_sandbox(&self, id: &str) -> RuntimeResult<()> {
        let mut c = self.runtime.clone();
        bounded(
            "RemovePodSandbox",
            Duration::ZERO,
            c.remove_pod_sandbox(cri::RemovePodSandboxRequest {
                pod_sandbox_id: id.to_owned(),
            }),
        )
        .await?;
        Ok(())
    }

    async fn image_present(&self, image: &str) -> RuntimeResult<bool> {
        let mut c = self.images.clone();
        let response = bounded(
            "ImageStatus",
            Duration::ZERO,
            c.image_status(cri::ImageStatusRequest {
                image: Some(cri::ImageSpec {
                    image: image.to_owned(),
                    ..cri::ImageSpec::default()
                }),
                verbose: false,
            }),
        )
        .await?;
        // CRI answers a missing image with an empty `image`, not an error.
        Ok(response.image.is_some_and(|i| !i.id.is_empty()))
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        sandbox: &SandboxConfig,
        config: &ContainerConfig,
    ) -> RuntimeResult<String> {
        let mut c = self.runtime.clone();
        let request = cri::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.to_owned(),
            config: Some(container_config(config, sandbox)),
            sandbox_config: Some(sandbox_config(sandbox)),
        };
        Ok(bounded(
            "CreateContainer",
            Duration::ZERO,
            c.create_container(request),
        )
        .await?
        .container_id)
    }

    async fn start_container(&self, id: &str) -> RuntimeResult<()> {
        let mut c = self.runtime.clone();
        bounded(
            "StartContainer",
            Duration::ZERO,
            c.start_container(cri::StartContainerRequest {
                container_id: id.to_owned(),
            }),
        )
        .await?;
        Ok(())
    }

    async fn stop_container(&self, id: &str, timeout: i64) -> RuntimeResult<()> {
        let mut c = self.runtime.clone();
        let grace = Duration::from_secs(u64::try_from(timeout).unwrap_or(0));
        bounded(
            "StopContainer",
            grace,
            c.stop_container(cri::StopContainerRequest {
                container_id: id.to_owned(),
                timeout,
            }),
        )
        .await?;
        Ok(())
    }

    async fn remove_container(&self, id: &str) -> RuntimeResult<()> {
        let mut c = self.runtime.clone();
        bounded(
            "RemoveContainer",
            Duration::ZERO,
            c.remove_container(cri::RemoveContainerRequest {
                container_id: id.to_owned(),
            }),
        )
        .await?;
        Ok(())
    }

    async fn container_status(&self, id: &str) -> RuntimeResult<ContainerStatus> {
        let mut c = self.runtime.clone();
        let response = bounded(
            "ContainerStatus",
            Duration::ZERO,
            c.container_status(cri::ContainerStatusRequest {
                container_id: id.to_owned(),
                verbose: false,
            }),
        )
        .await?;
        let s = response.status.ok_or_else(|| RuntimeError::Call {
            call: "ContainerStatus",
            message: format!("no status for container {id}"),
        })?;
        Ok(ContainerStatus {
            id: s.id,
            state: state(s.state),
            created_at: s.created_at,
            started_at: s.started_at,
            finished_at: s.finished_at,
            exit_code: s.exit_code,
            reason: s.reason,
            message: s.message,
            image_ref: s.image_ref,
        })
    }

    async fn list_sandboxes(&self) -> RuntimeResult<Vec<SandboxInfo>> {
        let mut c = self.runtime.clone();
        let response = bounded(
            "ListPodSandbox",
            Duration::ZERO,
            c.list_pod_sandbox(cri::ListPodSandboxRequest {
                filter: Some(cri::PodSandboxFilter::default()),
            }),
        )
        .await?;
        Ok(response
            .items
            .into_iter()
            .filter_map(|s| {
                let pod_uid = s.labels.get(labels::POD_UID)?.clone();
                Some(SandboxInfo {
                    node: s.labels.get(labels::NODE).cloned().unwrap_or_default(),
                    id: s.id,
                    pod_uid,
                    ready: s.state == i32::from(cri::PodSandboxState::SandboxReady),
                    attempt: s.metadata.map_or(0, |m| m.attempt),
                })
            })
            .collect())
    }

    async fn list_containers(&self) -> RuntimeResult<Vec<ContainerInfo>> {
        let mut c = self.runtime.clone();
        let response = bounded(
            "ListContainers",
            Duration::ZERO,
            c.list_containers(cri::ListContainersRequest {
                filter: Some(cri::ContainerFilter::default()),
            }),
        )
        .await?;
        Ok(response
            .containers
            .into_iter()
            .filter_map(|x| {
                let pod_uid = x.labels.get(labels::POD_UID)?.clone();
                let (name, attempt) = x
                    .metadata
                    .map(|m| (m.name, m.attempt))
                    .or_else(|| Some((x.labels.get(labels::CONTAINER_NAME)?.clone(), 0)))?;
                Some(ContainerInfo {
                    node: x.labels.get(labels::NODE).cloned().unwrap_or_default(),
                    id: x.id,
                    sandbox_id: x.pod_sandbox_id,
                    pod_uid,
                    name,
                    attempt,
                    state: state(x.state),
                })
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_modes_follow_the_pod_and_repeat_in_each_container() {
        for (pid, host_ipc, want_pid, want_ipc) in [
            (
                PidNamespace::Container,
                false,
                cri::NamespaceMode::Container,
                cri::NamespaceMode::Pod,
            ),
            (
                PidNamespace::Pod,
                false,
                cri::NamespaceMode::Pod,
                cri::NamespaceMode::Pod,
            ),
            (
                PidNamespace::Node,
                true,
                cri::NamespaceMode::Node,
                cri::NamespaceMode::Node,
            ),
        ] {
            let sandbox = SandboxConfig {
                pid,
                host_ipc,
                ..SandboxConfig::default()
            };
            let from_sandbox = sandbox_config(&sandbox)
                .linux
                .and_then(|l| l.security_context)
                .and_then(|s| s.namespace_options)
                .expect("sandbox namespace options");
            let from_container = container_config(&ContainerConfig::default(), &sandbox)
                .linux
                .and_then(|l| l.security_context)
                .and_then(|s| s.namespace_options)
                .expect("container namespace options");
            assert_eq!(from_sandbox, from_container);
            assert_eq!(from_sandbox.pid, i32::from(want_pid), "{pid:?}");
            assert_eq!(from_sandbox.ipc, i32::from(want_ipc), "{pid:?}");
            assert_eq!(from_sandbox.network, i32::from(cri::NamespaceMode::Node));
        }
    }

    #[test]
    fn allocation_fields_reach_the_cri_config() {
        let config = ContainerConfig {
            name: "c".to_owned(),
            mounts: vec![super::super::Mount {
                container_path: "/in".to_owned(),
                host_path: "/out".to_owned(),
                readonly: true,
            }],
            devices: vec![super::super::Device {
                container_path: "/dev/x".to_owned(),
                host_path: "/dev/y".to_owned(),
                permissions: "rw".to_owned(),
            }],
            annotations: [("a".to_owned(), "b".to_owned())].into(),
            cdi_devices: vec!["vendor.com/class=one".to_owned()],
            envs: vec![("K".to_owned(), "V".to_owned())],
            ..ContainerConfig::default()
        };
        let cri = container_config(&config, &SandboxConfig::default());
        assert_eq!(
            cri.cdi_devices,
            [cri::CdiDevice {
                name: "vendor.com/class=one".to_owned()
            }]
        );
        assert_eq!(cri.mounts[0].host_path, "/out");
        assert!(cri.mounts[0].readonly);
        assert_eq!(cri.devices[0].permissions, "rw");
        assert_eq!(cri.annotations.get("a").map(String::as_str), Some("b"));
        assert_eq!(cri.envs[0].key, "K");
    }
}
