//! The pod state machine against the recording runtime.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Container, EnvVar, Pod, PodSpec, PodStatus, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use super::admission::NodeResources;
use super::{NodeContext, PodState, SIM_ROOT_ENV, UNEXPECTED_ADMISSION_ERROR};
use crate::devices::DeviceManager;
use crate::runtime::ContainerRuntime;
use crate::runtime::recording::RecordingRuntime;

struct Fixture {
    rt: Arc<RecordingRuntime>,
    ctx: NodeContext,
    _dir: tempfile::TempDir,
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let devices = DeviceManager::start(&dir.path().join("var/lib/kubelet"))
        .await
        .expect("device manager");
    let rt = Arc::new(RecordingRuntime::new());
    let ctx = NodeContext {
        node_name: "node-a".to_owned(),
        root: dir.path().to_owned(),
        runtime: Arc::clone(&rt) as Arc<dyn ContainerRuntime>,
        runtime_name: "containerd".to_owned(),
        devices,
        host_ip: "127.0.0.1".to_owned(),
        cgroup_parent: String::new(),
        node_resources: Arc::new(NodeResources::new(&quantities(&[
            ("cpu", "2"),
            ("memory", "4Gi"),
            ("ephemeral-storage", "100Gi"),
            ("pods", "110"),
        ]))),
        sim_node_root: None,
    };
    Fixture { rt, ctx, _dir: dir }
}

fn quantities(list: &[(&str, &str)]) -> std::collections::BTreeMap<String, Quantity> {
    list.iter()
        .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
        .collect()
}

fn container(name: &str, command: &[&str]) -> Container {
    Container {
        name: name.to_owned(),
        image: Some("busybox".to_owned()),
        command: Some(command.iter().map(|s| (*s).to_owned()).collect()),
        ..Container::default()
    }
}

fn pod(name: &str, policy: &str, containers: Vec<Container>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some("default".to_owned()),
            uid: Some(format!("uid-{name}")),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some("node-a".to_owned()),
            restart_policy: Some(policy.to_owned()),
            containers,
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some("Pending".to_owned()),
            ..PodStatus::default()
        }),
    }
}

fn phase(status: &PodStatus) -> &str {
    status.phase.as_deref().unwrap_or_default()
}

fn only_container(status: &PodStatus) -> Value {
    let statuses = status.container_statuses.clone().unwrap_or_default();
    assert_eq!(statuses.len(), 1, "one container status: {statuses:?}");
    serde_json::to_value(&statuses[0]).expect("json")
}

/// The configs of every CreateContainer call so far, in order; with `pod`,
/// only those in that pod's sandbox.
fn created_configs(rt: &RecordingRuntime, pod: Option<&str>) -> Vec<Value> {
    rt.calls()
        .into_iter()
        .filter(|c| c["call"] == "CreateContainer")
        .filter(|c| pod.is_none_or(|name| c["request"]["sandbox_config"]["name"] == name))
        .map(|c| c["request"]["config"].clone())
        .collect()
}

/// The container names of `configs`.
fn names(configs: &[Value]) -> Vec<&str> {
    configs
        .iter()
        .map(|c| c["name"].as_str().unwrap_or_default())
        .collect()
}

fn condition(status: &PodStatus, kind: &str) -> String {
    status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == kind)
        .map(|c| c.status.clone())
        .unwrap_or_else(|| panic!("no {kind} condition in {:?}", status.conditions))
}

#[tokio::test]
async fn new_pod_runs_its_containers_and_reports_running() {
    let fx = fixture().await;
    let p = pod("web", "Always", vec![container("main", &["sleep", "1000"])]);
    let mut state = PodState::new(&p);
    let status = state.sync(&fx.ctx, &p).await;
    assert_eq!(
        fx.rt.call_names(),
        [
            "RunPodSandbox",
            "ImageStatus",
            "CreateContainer",
            "StartContainer"
        ]
    );
    assert_eq!(phase(&status), "Running");
    let c = only_container(&status);
    assert!(c["state"]["running"]["startedAt"].is_string(), "{c}");
    assert_eq!(c["ready"], true);
    assert_eq!(c["restartCount"], 0);
    assert!(
        c["containerID"]
            .as_str()
            .is_some_and(|id| id.starts_with("containerd://container")),
        "{c}"
    );
    for kind in ["Initialized", "Ready", "ContainersReady", "PodScheduled"] {
        assert_eq!(condition(&status, kind), "True", "{kind}");
    }
    assert_eq!(status.pod_ip.as_deref(), Some("127.0.0.1"));
    assert_eq!(status.host_ip.as_deref(), Some("127.0.0.1"));

    // A second pass changes nothing and creates nothing.
    let again = state.sync(&fx.ctx, &p).await;
    assert_eq!(fx.rt.counts(), (1, 1));
    assert_eq!(
        serde_json::to_value(&again).expect("json"),
        serde_json::to_value(&status).expect("json"),
        "an unchanged pod keeps an identical status (no needless writes)"
    );
}

#[tokio::test]
async fn create_container_carries_the_pod_spec() {
    let fx = fixture().await;
    let mut c = container("main", &["/bin/sh", "-c"]);
    c.args = Some(vec!["echo $GREETING".to_owned()]);
    c.working_dir = Some("/tmp".to_owned());
    c.env = Some(vec![EnvVar {
        name: "GREETING".to_owned(),
        value: Some("hello".to_owned()),
        value_from: None,
    }]);
    let p = pod("spec", "Never", vec![c]);
    let mut state = PodState::new(&p);
    state.sync(&fx.ctx, &p).await;
    let calls = fx.rt.calls();
    let sandbox = &calls[0]["request"]["config"];
    assert_eq!(sandbox["name"], "spec");
    assert_eq!(sandbox["uid"], "uid-spec");
    assert_eq!(sandbox["labels"]["io.kubernetes.pod.uid"], "uid-spec");
    assert!(
        sandbox["log_directory"]
            .as_str()
            .is_some_and(|d| d.ends_with("var/log/pods/default_spec_uid-spec")),
        "{sandbox}"
    );
    let configs = created_configs(&fx.rt, None);
    let config = configs.first().expect("CreateContainer");
    assert_eq!(config["command"], serde_json::json!(["/bin/sh", "-c"]));
    assert_eq!(config["args"], serde_json::json!(["echo $GREETING"]));
    assert_eq!(config["working_dir"], "/tmp");
    assert_eq!(config["envs"], serde_json::json!([["GREETING", "hello"]]));
    assert_eq!(config["labels"]["io.kubernetes.container.name"], "main");
    assert_eq!(config["log_path"], "main/0.log");
}

/// `--sim-node-root`: every container gets the node root bind-mounted
/// read-write at the same path and `TESSERA_SIM_ROOT` naming it, after its
/// own env; without the flag, neither.
#[tokio::test]
async fn a_sim_node_root_is_mounted_into_every_container() {
    let mut fx = fixture().await;
    let root = fx.ctx.root.clone();
    let p = pod("plain", "Never", vec![container("main", &["true"])]);
    PodState::new(&p).sync(&fx.ctx, &p).await;
    let plain = created_configs(&fx.rt, Some("plain"));
    assert_eq!(plain[0]["mounts"], serde_json::json!([]), "{}", plain[0]);
    assert_eq!(plain[0]["envs"], serde_json::json!([]), "{}", plain[0]);

    fx.ctx.sim_node_root = Some(root.clone());
    let mut c = container("main", &["true"]);
    c.env = Some(vec![EnvVar {
        name: "OWN".to_owned(),
        value: Some("1".to_owned()),
        value_from: None,
    }]);
    let p = pod("sim", "Never", vec![c, container("second", &["true"])]);
    PodState::new(&p).sync(&fx.ctx, &p).await;
    let configs = created_configs(&fx.rt, Some("sim"));
    assert_eq!(names(&configs), ["main", "second"]);
    let root = root.display().to_string();
    for config in &configs {
        assert_eq!(
            config["mounts"],
            serde_json::json!([{"container_path": root, "host_path": root, "readonly": false}]),
            "{config}"
        );
        let envs = config["envs"].as_array().cloned().unwrap_or_default();
        assert_eq!(
            envs.last(),
            Some(&serde_json::json!([SIM_ROOT_ENV, root])),
            "{config}"
        );
    }
    assert_eq!(configs[0]["envs"][0], serde_json::json!(["OWN", "1"]));
}

fn requesting(name: &str, policy: &str, resources: &[(&str, &str)]) -> Pod {
    let mut c = container("main", &["sleep"]);
    c.resources = Some(ResourceRequirements {
        limits: Some(quantities(resources)),
        ..ResourceRequirements::default()
    });
    pod(name, policy, vec![c])
}

#[tokio::test]
async fn extended_resources_the_node_lacks_are_left_to_the_scheduler() {
    let fx = fixture().await;
    // A cluster-level resource (a scheduler extender's, no device plugin's).
    let p = requesting("cluster", "Always", &[("example.com/cluster-only", "1000")]);
    let mut state = PodState::new(&p);
    let status = state.sync(&fx.ctx, &p).await;
    assert_eq!(phase(&status), "Running", "{status:?}");
    assert!(state.take_events().iter().all(|e| e.kind == "Normal"));
    // Native resources within the node's allocatable fit too.
    let p = requesting("cpu-only", "Always", &[("cpu", "500m"), ("memory", "1Gi")]);
    let status = PodState::new(&p).sync(&fx.ctx, &p).await;
    assert_eq!(phase(&status), "Running", "{status:?}");
}

#[tokio::test]
async fn a_pod_over_the_nodes_allocatable_fails_out_of_the_resource() {
    let fx = fixture().await;
    // Advertised on the Node by someone else, served by no device plugin.
    fx.ctx.node_resources.set_allocatable(&quantities(&[
        ("cpu", "2"),
        ("memory", "4Gi"),
        ("pods", "110"),
        ("example.com/widget", "2"),
    ]));
    let mut first = None;
    for name in ["w1", "w2"] {
        let p = requesting(name, "Never", &[("example.com/widget", "1")]);
        let mut state = PodState::new(&p);
        let status = state.sync(&fx.ctx, &p).await;
        assert_eq!(phase(&status), "Running", "{name}: {status:?}");
        first.get_or_insert((p, state));
    }
    let calls_before = fx.rt.calls().len();
    let p = requesting("w3", "Never", &[("example.com/widget", "1")]);
    let mut state = PodState::new(&p);
    let status = state.sync(&fx.ctx, &p).await;
    assert_eq!(phase(&status), "Failed");
    assert_eq!(status.reason.as_deref(), Some("OutOfexample.com/widget"));
    assert_eq!(
        status.message.as_deref(),
        Some(
            "Pod was rejected: Node didn't have enough resource: example.com/widget, requested: 1, used: 2, capacity: 2"
        )
    );
    assert_eq!(fx.rt.calls().len(), calls_before, "nothing runs for it");
    let events = state.take_events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].reason, "OutOfexample.com/widget");
    assert_eq!(events[0].kind, "Warning");

    // A finished pod no longer counts: another one fits.
    let (p1, mut s1) = first.expect("w1");
    assert!(fx.rt.exit_container("uid-w1", "main", 0));
    assert_eq!(phase(&s1.sync(&fx.ctx, &p1).await), "Succeeded");
    let p = requesting("w4", "Never", &[("example.com/widget", "1")]);
    assert_eq!(phase(&PodState::new(&p).sync(&fx.ctx, &p).await), "Running");

    // cpu in millicores: 3 cpus on a 2-cpu node.
    let p = requesting("big", "Never", &[("cpu", "3")]);
    let status = PodState::new(&p).sync(&fx.ctx, &p).await;
    assert_eq!(status.reason.as_deref(), Some("OutOfcpu"));
    assert!(
        status.message.as_deref().is_some_and(|m| m.ends_with(
            "Node didn't have enough resource: cpu, requested: 3000, used: 0, capacity: 2000"
        )),
        "{status:?}"
    );
    // The node reports no hugepages: none fit, as on a kubelet with none.
    let p = requesting("huge", "Never", &[("hugepages-2Mi", "2Mi")]);
    let status = PodState::new(&p).sync(&fx.ctx, &p).await;
    assert_eq!(status.reason.as_deref(), Some("OutOfhugepages-2Mi"));
}

#[tokio::test]
async fn a_fractional_device_count_fails_with_the_field_named() {
    let fx = fixture().await;
    let mut c = container("main", &["true"]);
    c.resources = Some(ResourceRequirements {
        limits: Some([("example.com/dev".to_owned(), Quantity("1.5".to_owned()))].into()),
        ..ResourceRequirements::default()
    });
    let p = pod("half", "Never", vec![c]);
    let status = PodState::new(&p).sync(&fx.ctx, &p).await;
    assert_eq!(phase(&status), "Failed");
    let message = status.message.unwrap_or_default();
    assert!(
        message.contains("resources[example.com/dev]") && message.contains("1.5"),
        "{message}"
    );
}

#[tokio::test]
async fn exit_codes_decide_succeeded_and_failed_under_never() {
    let fx = fixture().await;
    for (name, code, want) in [("ok", 0, "Succeeded"), ("bad", 3, "Failed")] {
        let p = pod(name, "Never", vec![container("main", &["true"])]);
        let mut state = PodState::new(&p);
        assert_eq!(phase(&state.sync(&fx.ctx, &p).await), "Running");
        assert!(fx.rt.exit_container(&format!("uid-{name}"), "main", code));
        let status = state.sync(&fx.ctx, &p).await;
        assert_eq!(phase(&status), want, "exit {code}");
        let c = only_container(&status);
        assert_eq!(c["state"]["terminated"]["exitCode"], code, "{c}");
        let reason = if code == 0 { "Completed" } else { "Error" };
        assert_eq!(c["state"]["terminated"]["reason"], reason);
        assert_eq!(c["ready"], false);
        assert_eq!(condition(&status, "Ready"), "False");
        assert!(state.is_terminal());
        // Nothing restarts a finished pod, and its sandbox was stopped.
        let creates = created_configs(&fx.rt, None).len();
        state.sync(&fx.ctx, &p).await;
        let after = created_configs(&fx.rt, None).len();
        assert_eq!(creates, after);
        assert_eq!(
            fx.rt.call_names().last().map(String::as_str),
            Some("StopPodSandbox")
        );
    }
}

#[tokio::test]
async fn always_restarts_with_doubling_back_off() {
    let fx = fixture().await;
    let p = pod("crash", "Always", vec![container("main", &["false"])]);
    let mut state = PodState::new(&p);
    state.sync(&fx.ctx, &p).await;
    let creates = |rt: &RecordingRuntime| {
        created_configs(rt, None)
            .iter()
            .map(|c| c["attempt"].as_u64().unwrap_or(99))
            .collect::<Vec<_>>()
    };
    assert!(fx.rt.exit_container("uid-crash", "main", 1));
    let status = state.sync(&fx.ctx, &p).await;
    let c = only_container(&status);
    assert_eq!(c["state"]["waiting"]["reason"], "CrashLoopBackOff", "{c}");
    assert_eq!(c["lastState"]["terminated"]["exitCode"], 1, "{c}");
    assert_eq!(phase(&status), "Running", "Always keeps the pod Running");
    // Within the back-off nothing is recreated.
    state.sync(&fx.ctx, &p).await;
    assert_eq!(creates(&fx.rt), [0]);

    tokio::time::sleep(Duration::from_millis(1100)).await;
    let status = state.sync(&fx.ctx, &p).await;
    assert_eq!(creates(&fx.rt), [0, 1], "restarted once after 1 s");
    let c = only_container(&status);
    assert_eq!(c["restartCount"], 1);
    assert!(c["state"]["running"].is_object(), "{c}");
    assert_eq!(c["lastState"]["terminated"]["exitCode"], 1, "{c}");
    // The exited attempt was removed: one container in the runtime.
    assert_eq!(fx.rt.counts().0, 1);

    // Second crash: the back-off is now 2 s.
    assert!(fx.rt.exit_container("uid-crash", "main", 2));
    state.sync(&fx.ctx, &p).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    state.sync(&fx.ctx, &p).await;
    assert_eq!(creates(&fx.rt), [0, 1], "still backing off after 1.2 s");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let status = state.sync(&fx.ctx, &p).await;
    assert_eq!(creates(&fx.rt), [0, 1, 2]);
    assert_eq!(only_container(&status)["restartCount"], 2);
}

#[tokio::test]
async fn on_failure_does_not_restart_a_clean_exit() {
    let fx = fixture().await;
    let p = pod("job", "OnFailure", vec![container("main", &["true"])]);
    let mut state = PodState::new(&p);
    state.sync(&fx.ctx, &p).await;
    assert!(fx.rt.exit_container("uid-job", "main", 0));
    let status = state.sync(&fx.ctx, &p).await;
    assert_eq!(phase(&status), "Succeeded");
}

#[tokio::test]
async fn a_missing_image_waits_with_err_image_never_pull() {
    let fx = fixture().await;
    fx.rt.remove_image("busybox");
    let p = pod("noimg", "Always", vec![container("main", &["true"])]);
    let mut state = PodState::new(&p);
    let status = state.sync(&fx.ctx, &p).await;
    assert_eq!(phase(&status), "Pending");
    let c = only_container(&status);
    assert_eq!(c["state"]["waiting"]["reason"], "ErrImageNeverPull", "{c}");
    assert!(
        c["state"]["waiting"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("never pulls") && m.contains("import")),
        "{c}"
    );
    assert!(!fx.rt.call_names().contains(&"CreateContainer".to_owned()));
    let events = state.take_events();
    assert!(
        events.iter().any(|e| e.reason == "ErrImageNeverPull"),
        "{events:?}"
    );
}

#[tokio::test]
async fn runtime_errors_show_in_status_and_events_and_are_retried() {
    let fx = fixture().await;
    fx.rt.fail_next("RunPodSandbox", "no sandbox today");
    let p = pod("flaky", "Always", vec![container("main", &["true"])]);
    let mut state = PodState::new(&p);
    let status = state.sync(&fx.ctx, &p).await;
    assert_eq!(phase(&status), "Pending");
    let events = state.take_events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].reason, "FailedCreatePodSandBox");
    assert!(events[0].message.contains("no sandbox today"));
    tokio::time::sleep(Duration::from_millis(2100)).await;
    fx.rt.fail_next("CreateContainer", "bad config");
    let status = state.sync(&fx.ctx, &p).await;
    let c = only_container(&status);
    assert_eq!(
        c["state"]["waiting"]["reason"], "CreateContainerError",
        "{c}"
    );
    assert!(
        c["state"]["waiting"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("bad config"))
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let status = state.sync(&fx.ctx, &p).await;
    assert_eq!(phase(&status), "Running");
}

#[tokio::test]
async fn tear_down_stops_then_removes_containers_then_the_sandbox() {
    let fx = fixture().await;
    let p = pod(
        "bye",
        "Always",
        vec![container("a", &["sleep"]), container("b", &["sleep"])],
    );
    let mut state = PodState::new(&p);
    state.sync(&fx.ctx, &p).await;
    let before = fx.rt.calls().len();
    state.tear_down(&fx.ctx, 7).await.expect("tear down");
    let calls = fx.rt.calls();
    let names: Vec<&str> = calls[before..]
        .iter()
        .map(|c| c["call"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        names,
        [
            "StopContainer",
            "StopContainer",
            "RemoveContainer",
            "RemoveContainer",
            "StopPodSandbox",
            "RemovePodSandbox"
        ]
    );
    assert_eq!(
        calls[before]["request"]["timeout"], 7,
        "the grace period is the stop timeout"
    );
    assert_eq!(fx.rt.counts(), (0, 0));
    // Again: nothing left, nothing fails.
    state.tear_down(&fx.ctx, 0).await.expect("second tear down");
}

#[tokio::test]
async fn adopting_a_running_pod_makes_no_second_container() {
    let fx = fixture().await;
    let p = pod("keep", "Always", vec![container("main", &["sleep"])]);
    let mut first = PodState::new(&p);
    let status = first.sync(&fx.ctx, &p).await;
    // A kubelet restart: a fresh state adopts what the runtime lists.
    let mut p2 = p.clone();
    p2.status = Some(status);
    let sandboxes = fx.rt.list_sandboxes().await.expect("sandboxes");
    let containers = fx.rt.list_containers().await.expect("containers");
    let mut second = PodState::new(&p2);
    second.adopt(&sandboxes, &containers);
    let before = fx.rt.call_names().len();
    let status = second.sync(&fx.ctx, &p2).await;
    assert_eq!(phase(&status), "Running");
    let new_calls = &fx.rt.call_names()[before..];
    assert!(
        new_calls.is_empty(),
        "no runtime calls but status reads: {new_calls:?}"
    );
    assert_eq!(fx.rt.counts(), (1, 1));
}

#[tokio::test]
async fn init_containers_run_first_one_at_a_time() {
    let fx = fixture().await;
    let mut p = pod("init", "Always", vec![container("main", &["sleep"])]);
    if let Some(spec) = p.spec.as_mut() {
        spec.init_containers = Some(vec![container("setup", &["true"])]);
    }
    let mut state = PodState::new(&p);
    let status = state.sync(&fx.ctx, &p).await;
    assert_eq!(phase(&status), "Pending");
    assert_eq!(condition(&status, "Initialized"), "False");
    assert_eq!(names(&created_configs(&fx.rt, None)), ["setup"]);
    assert!(fx.rt.exit_container("uid-init", "setup", 0));
    let status = state.sync(&fx.ctx, &p).await;
    assert_eq!(phase(&status), "Running");
    assert_eq!(condition(&status, "Initialized"), "True");
}

/// A device plugin for `example.com/dev` (two devices unless told), served
/// on a unix socket and registered with the manager, as a real one does; it
/// counts its Allocate calls.
mod fake_plugin {
    use std::path::{Path, PathBuf};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tessera_kube_proto::deviceplugin::v1beta1 as dp;
    use tonic::{Request, Response, Status};

    pub const RESOURCE: &str = "example.com/dev";

    #[derive(Default)]
    pub struct Plugin {
        pub allocate_calls: AtomicUsize,
        devices: Vec<String>,
    }

    struct Service(Arc<Plugin>);

    #[tonic::async_trait]
    impl dp::device_plugin_server::DevicePlugin for Service {
        async fn get_device_plugin_options(
            &self,
            _: Request<dp::Empty>,
        ) -> Result<Response<dp::DevicePluginOptions>, Status> {
            Ok(Response::new(dp::DevicePluginOptions::default()))
        }

        type ListAndWatchStream =
            futures::stream::BoxStream<'static, Result<dp::ListAndWatchResponse, Status>>;

        async fn list_and_watch(
            &self,
            _: Request<dp::Empty>,
        ) -> Result<Response<Self::ListAndWatchStream>, Status> {
            use futures::StreamExt;
            let devices = self
                .0
                .devices
                .iter()
                .map(|id| dp::Device {
                    id: id.clone(),
                    health: "Healthy".to_owned(),
                    topology: None,
                })
                .collect();
            let first =
                futures::stream::once(async move { Ok(dp::ListAndWatchResponse { devices }) });
            Ok(Response::new(
                first.chain(futures::stream::pending()).boxed(),
            ))
        }

        async fn get_preferred_allocation(
            &self,
            _: Request<dp::PreferredAllocationRequest>,
        ) -> Result<Response<dp::PreferredAllocationResponse>, Status> {
            Err(Status::unimplemented("not asked for"))
        }

        async fn allocate(
            &self,
            request: Request<dp::AllocateRequest>,
        ) -> Result<Response<dp::AllocateResponse>, Status> {
            self.0.allocate_calls.fetch_add(1, Ordering::SeqCst);
            let responses = request
                .into_inner()
                .container_requests
                .into_iter()
                .map(|r| {
                    let ids = r.devices_ids.join(",");
                    dp::ContainerAllocateResponse {
                        envs: [("EXAMPLE_DEVS".to_owned(), ids.clone())].into(),
                        mounts: vec![dp::Mount {
                            container_path: "/opt/dev".to_owned(),
                            host_path: "/var/lib/example".to_owned(),
                            read_only: true,
                        }],
                        devices: vec![dp::DeviceSpec {
                            container_path: "/dev/example0".to_owned(),
                            host_path: "/dev/null".to_owned(),
                            permissions: "rw".to_owned(),
                        }],
                        annotations: [("example.com/devs".to_owned(), ids)].into(),
                        cdi_devices: r
                            .devices_ids
                            .iter()
                            .map(|id| dp::CdiDevice {
                                name: format!("example.com/dev={id}"),
                            })
                            .collect(),
                    }
                })
                .collect();
            Ok(Response::new(dp::AllocateResponse {
                container_responses: responses,
            }))
        }

        async fn pre_start_container(
            &self,
            _: Request<dp::PreStartContainerRequest>,
        ) -> Result<Response<dp::PreStartContainerResponse>, Status> {
            Ok(Response::new(dp::PreStartContainerResponse {}))
        }
    }

    /// Serves the plugin in `<kubelet_dir>/device-plugins/` and registers it.
    pub async fn start(kubelet_dir: &Path) -> Arc<Plugin> {
        start_with(kubelet_dir, &["dev0", "dev1"]).await
    }

    /// [`start`] with these devices.
    pub async fn start_with(kubelet_dir: &Path, devices: &[&str]) -> Arc<Plugin> {
        let plugin = Arc::new(Plugin {
            allocate_calls: AtomicUsize::new(0),
            devices: devices.iter().map(|d| (*d).to_owned()).collect(),
        });
        let dir = kubelet_dir.join("device-plugins");
        let socket: PathBuf = dir.join("example.sock");
        let listener = tokio::net::UnixListener::bind(&socket).expect("plugin socket");
        let service =
            dp::device_plugin_server::DevicePluginServer::new(Service(Arc::clone(&plugin)));
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
        );
        let channel = tessera_kube_proto::unix_channel(&dir.join("kubelet.sock"))
            .await
            .expect("dial kubelet.sock");
        dp::registration_client::RegistrationClient::new(channel)
            .register(dp::RegisterRequest {
                version: "v1beta1".to_owned(),
                endpoint: "example.sock".to_owned(),
                resource_name: RESOURCE.to_owned(),
                options: Some(dp::DevicePluginOptions::default()),
            })
            .await
            .expect("Register");
        plugin
    }
}

/// Waits until the manager lists `count` healthy devices of the plugin.
async fn wait_for_devices(devices: &DeviceManager, count: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while devices
        .resources()
        .get(fake_plugin::RESOURCE)
        .map(|c| c.allocatable)
        != Some(count)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the plugin's devices never showed: {:?}",
            devices.resources()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn with_device(mut c: Container, count: &str) -> Container {
    c.resources = Some(ResourceRequirements {
        limits: Some(quantities(&[(fake_plugin::RESOURCE, count)])),
        ..ResourceRequirements::default()
    });
    c
}

#[tokio::test]
async fn an_init_container_hands_its_device_to_the_app_container() {
    use std::sync::atomic::Ordering;
    let fx = fixture().await;
    let plugin = fake_plugin::start_with(&fx._dir.path().join("var/lib/kubelet"), &["only"]).await;
    wait_for_devices(&fx.ctx.devices, 1).await;
    // One device on the node; the pod needs max(init 1, app 1) = 1.
    let mut p = pod(
        "handover",
        "Always",
        vec![with_device(container("main", &["sleep"]), "1")],
    );
    if let Some(spec) = p.spec.as_mut() {
        spec.init_containers = Some(vec![with_device(container("setup", &["true"]), "1")]);
    }
    let mut state = PodState::new(&p);
    let status = state.sync(&fx.ctx, &p).await;
    assert_eq!(phase(&status), "Pending", "{status:?}");
    assert!(fx.rt.exit_container("uid-handover", "setup", 0));
    let status = state.sync(&fx.ctx, &p).await;
    assert_eq!(phase(&status), "Running", "{status:?}");
    let configs = created_configs(&fx.rt, None);
    assert_eq!(names(&configs), ["setup", "main"]);
    let want = serde_json::json!(["example.com/dev=only"]);
    assert_eq!(configs[0]["cdi_devices"], want);
    assert_eq!(configs[1]["cdi_devices"], want, "the same device, reused");
    assert_eq!(
        fx.ctx.devices.container_devices("uid-handover", "main")[fake_plugin::RESOURCE],
        ["only"]
    );
    assert!(plugin.allocate_calls.load(Ordering::SeqCst) >= 1);
}

#[tokio::test]
async fn a_kubelet_restart_while_the_plugin_is_down_keeps_running_containers_devices() {
    use std::sync::atomic::Ordering;
    let fx = fixture().await;
    let kubelet_dir = fx._dir.path().join("var/lib/kubelet");
    let plugin = fake_plugin::start(&kubelet_dir).await;
    wait_for_devices(&fx.ctx.devices, 2).await;
    let p = pod(
        "survivor",
        "Always",
        vec![with_device(container("main", &["sleep"]), "1")],
    );
    let status = PodState::new(&p).sync(&fx.ctx, &p).await;
    assert_eq!(phase(&status), "Running", "{status:?}");
    let first = created_configs(&fx.rt, None).remove(0);

    // The kubelet restarts; the plugin has not registered again (the new
    // manager removed its socket).
    fx.ctx.devices.shutdown().await;
    let devices = DeviceManager::start(&kubelet_dir).await.expect("manager");
    let ctx = NodeContext {
        devices,
        node_resources: Arc::new(NodeResources::new(&quantities(&[
            ("cpu", "2"),
            ("pods", "110"),
        ]))),
        ..fx.ctx
    };
    let mut p2 = p.clone();
    p2.status = Some(status);
    let mut state = PodState::new(&p2);
    state.adopt(
        &fx.rt.list_sandboxes().await.expect("sandboxes"),
        &fx.rt.list_containers().await.expect("containers"),
    );
    let status = state.sync(&ctx, &p2).await;
    assert_eq!(
        phase(&status),
        "Running",
        "adopted, not refused: {status:?}"
    );
    assert_eq!(fx.rt.counts(), (1, 1), "no second container");

    // It crashes: restarted with the devices it had, no Allocate.
    assert!(fx.rt.exit_container("uid-survivor", "main", 1));
    state.sync(&ctx, &p2).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let status = state.sync(&ctx, &p2).await;
    assert_eq!(phase(&status), "Running", "{status:?}");
    let configs = created_configs(&fx.rt, None);
    assert_eq!(configs.len(), 2, "restarted once");
    assert_eq!(configs[1]["cdi_devices"], first["cdi_devices"]);
    assert_eq!(configs[1]["envs"], first["envs"]);
    assert_eq!(plugin.allocate_calls.load(Ordering::SeqCst), 1);
    ctx.devices.shutdown().await;
}

#[tokio::test]
async fn device_allocation_reaches_create_container_and_survives_restarts() {
    use std::sync::atomic::Ordering;
    let fx = fixture().await;
    let plugin = fake_plugin::start(&fx._dir.path().join("var/lib/kubelet")).await;
    wait_for_devices(&fx.ctx.devices, 2).await;
    let mut c = container("gpu", &["sleep"]);
    c.env = Some(vec![EnvVar {
        name: "FROM_SPEC".to_owned(),
        value: Some("1".to_owned()),
        value_from: None,
    }]);
    c.resources = Some(ResourceRequirements {
        limits: Some([(fake_plugin::RESOURCE.to_owned(), Quantity("1".to_owned()))].into()),
        ..ResourceRequirements::default()
    });
    let p = pod("devpod", "Always", vec![c]);
    let mut state = PodState::new(&p);
    let status = state.sync(&fx.ctx, &p).await;
    assert_eq!(phase(&status), "Running", "{status:?}");
    assert_eq!(plugin.allocate_calls.load(Ordering::SeqCst), 1);

    let first = created_configs(&fx.rt, None).remove(0);
    let cdi = first["cdi_devices"].as_array().cloned().unwrap_or_default();
    assert_eq!(cdi.len(), 1, "{first}");
    let device = cdi[0].as_str().unwrap_or_default().to_owned();
    assert!(
        device == "example.com/dev=dev0" || device == "example.com/dev=dev1",
        "{first}"
    );
    let id = device.trim_start_matches("example.com/dev=");
    assert_eq!(first["annotations"]["example.com/devs"], id, "{first}");
    assert_eq!(
        first["envs"],
        serde_json::json!([["FROM_SPEC", "1"], ["EXAMPLE_DEVS", id]])
    );
    assert_eq!(
        first["mounts"],
        serde_json::json!([{"container_path": "/opt/dev", "host_path": "/var/lib/example", "readonly": true}])
    );
    assert_eq!(
        first["devices"],
        serde_json::json!([{"container_path": "/dev/example0", "host_path": "/dev/null", "permissions": "rw"}])
    );

    // The container crashes and is restarted: same devices, no second Allocate.
    assert!(fx.rt.exit_container("uid-devpod", "gpu", 1));
    state.sync(&fx.ctx, &p).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    state.sync(&fx.ctx, &p).await;
    let all = created_configs(&fx.rt, None);
    assert_eq!(all.len(), 2, "restarted once");
    assert_eq!(all[1]["attempt"], 1);
    assert_eq!(all[1]["cdi_devices"], first["cdi_devices"]);
    assert_eq!(all[1]["envs"], first["envs"]);
    assert_eq!(
        plugin.allocate_calls.load(Ordering::SeqCst),
        1,
        "a restart does not allocate again"
    );

    // A second pod gets the other device; a third finds none left.
    let mut c2 = container("gpu", &["sleep"]);
    c2.resources = p
        .spec
        .as_ref()
        .and_then(|s| s.containers[0].resources.clone());
    let p2 = pod("devpod2", "Always", vec![c2.clone()]);
    let status = PodState::new(&p2).sync(&fx.ctx, &p2).await;
    assert_eq!(phase(&status), "Running");
    let second = created_configs(&fx.rt, None).pop().unwrap_or_default();
    assert_ne!(
        second["cdi_devices"], first["cdi_devices"],
        "a different device"
    );
    let p3 = pod("devpod3", "Always", vec![c2]);
    let status = PodState::new(&p3).sync(&fx.ctx, &p3).await;
    assert_eq!(phase(&status), "Failed");
    assert_eq!(status.reason.as_deref(), Some(UNEXPECTED_ADMISSION_ERROR));
}

#[tokio::test]
async fn a_failed_init_container_fails_a_never_pod_and_is_retried_otherwise() {
    let fx = fixture().await;
    for (policy, want) in [("Never", "Failed"), ("Always", "Pending")] {
        let name = format!("init-{}", policy.to_lowercase());
        let mut p = pod(&name, policy, vec![container("main", &["sleep"])]);
        if let Some(spec) = p.spec.as_mut() {
            spec.init_containers = Some(vec![container("setup", &["false"])]);
        }
        let mut state = PodState::new(&p);
        state.sync(&fx.ctx, &p).await;
        assert!(fx.rt.exit_container(&format!("uid-{name}"), "setup", 1));
        let status = state.sync(&fx.ctx, &p).await;
        assert_eq!(phase(&status), want, "{policy}");
        assert_eq!(
            names(&created_configs(&fx.rt, Some(&name))),
            ["setup"],
            "{policy}: the app container never starts"
        );
        if policy == "Always" {
            tokio::time::sleep(Duration::from_millis(1100)).await;
            state.sync(&fx.ctx, &p).await;
            let attempts: Vec<u64> = created_configs(&fx.rt, Some(&name))
                .iter()
                .filter_map(|c| c["attempt"].as_u64())
                .collect();
            assert_eq!(
                attempts,
                [0, 1],
                "the init container is retried after its back-off"
            );
        }
    }
}

#[tokio::test]
async fn a_failed_start_is_retried_after_a_back_off_not_every_sync() {
    let fx = fixture().await;
    let p = pod("nostart", "Always", vec![container("main", &["sleep"])]);
    let mut state = PodState::new(&p);
    fx.rt.fail_next("StartContainer", "exec format error");
    let status = state.sync(&fx.ctx, &p).await;
    let c = only_container(&status);
    assert_eq!(c["state"]["waiting"]["reason"], "RunContainerError", "{c}");
    let starts = |rt: &RecordingRuntime| {
        rt.call_names()
            .iter()
            .filter(|c| *c == "StartContainer")
            .count()
    };
    state.sync(&fx.ctx, &p).await;
    assert_eq!(starts(&fx.rt), 1, "no second start within the back-off");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let status = state.sync(&fx.ctx, &p).await;
    assert_eq!(starts(&fx.rt), 2);
    assert_eq!(phase(&status), "Running");
    assert_eq!(
        fx.rt.counts().0,
        1,
        "the created container was started, not made again"
    );
}
