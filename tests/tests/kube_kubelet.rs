//! The kubelet stand-in (`tessera-sim kubelet`) as a real process against
//! the stand-in API server (or `TESSERA_E2E_KUBECONFIG`'s cluster is not
//! used here: a real cluster has its own kubelets) and a private containerd
//! 1.7 over CRI: node registration and lease, pods bound to the node run
//! with their command and env, exit codes decide Succeeded/Failed, deletion
//! removes containers and sandbox and then the pod object, a kubelet restart
//! adopts what runs, admission ignores extended resources the node does not
//! list and rejects pods over its allocatable (`OutOf<resource>`),
//! PodResources lists pods without devices, and the dry-run mode records CRI
//! requests instead of running anything.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, NodeStatus, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};
use tessera_test_support::containerd::{self, Containerd, IMAGE, Options};
use tessera_test_support::kube::{StandInApiServer, client};
use tessera_test_support::{Need, artefact, free_port, require};

/// One containerd at a time: the machine has two cores.
static SERIAL: Mutex<()> = Mutex::new(());

const NAMESPACE: &str = "default";

/// A `tessera-sim kubelet` child; SIGTERM (then SIGKILL) on drop.
struct Kubelet {
    child: Option<Child>,
    args: Vec<String>,
    log: PathBuf,
}

impl Kubelet {
    fn start(args: Vec<String>, log: PathBuf) -> Result<Kubelet> {
        let mut k = Kubelet {
            child: None,
            args,
            log,
        };
        k.spawn()?;
        Ok(k)
    }

    fn spawn(&mut self) -> Result<()> {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let child = Command::new(artefact("tessera-sim"))
            .arg("kubelet")
            .args(&self.args)
            .env("TESSERA_LOG", "info,tessera_kube_kubelet=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("spawning tessera-sim kubelet")?;
        self.child = Some(child);
        Ok(())
    }

    fn stop(&mut self) {
        if let Some(child) = self.child.take() {
            tessera_test_support::terminate(child, Duration::from_secs(10));
        }
    }

    /// Whether it still runs (a kubelet that exits on its own is a failure).
    fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.stop();
    }
}

/// An API server, a node root, maybe a containerd, and a kubelet.
struct Env {
    kubelet: Kubelet,
    daemon: Option<Containerd>,
    api: StandInApiServer,
    rt: tokio::runtime::Runtime,
    client: kube::Client,
    node: String,
    root: tempfile::TempDir,
}

fn needs(with_containerd: bool) -> Vec<Need> {
    let mut needs = tessera_test_support::kube::needs();
    needs.push(Need::Built("tessera-sim"));
    if with_containerd {
        needs.extend(containerd::needs());
    }
    needs
}

impl Env {
    /// `runtime`: `None` starts a containerd and uses CRI; `Some(args)`
    /// passes those runtime options instead (`--dry-run FILE`).
    fn start(node: &str, runtime: Option<Vec<String>>) -> Env {
        Env::start_with(node, runtime, &[])
    }

    /// [`Env::start`] with extra `tessera-sim apiserver` arguments.
    fn start_with(node: &str, runtime: Option<Vec<String>>, api_args: &[&str]) -> Env {
        let api = StandInApiServer::start(api_args).expect("stand-in API server");
        let root = tempfile::Builder::new()
            .prefix("tessera-kubelet-root-")
            .tempdir()
            .expect("node root");
        let (daemon, runtime_args) = match runtime {
            Some(args) => (None, args),
            None => {
                let daemon = Containerd::start(Options::default()).expect("containerd");
                let endpoint = format!("unix://{}", daemon.dirs().socket.display());
                (Some(daemon), vec!["--cri-endpoint".to_owned(), endpoint])
            }
        };
        let mut args = vec![
            "--node".to_owned(),
            node.to_owned(),
            "--root".to_owned(),
            root.path().display().to_string(),
            "--kubeconfig".to_owned(),
            api.kubeconfig().display().to_string(),
            "--node-labels".to_owned(),
            "tessera.io/test=kubelet,zone=a".to_owned(),
        ];
        args.extend(runtime_args);
        let kubelet =
            Kubelet::start(args, root.path().join("kubelet.log")).expect("kubelet starts");
        let rt = tokio::runtime::Runtime::new().expect("tokio");
        let client = rt.block_on(client(api.kubeconfig())).expect("kube client");
        Env {
            kubelet,
            daemon,
            api,
            rt,
            client,
            node: node.to_owned(),
            root,
        }
    }

    fn daemon(&self) -> &Containerd {
        self.daemon.as_ref().expect("a containerd")
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    /// Fails with the kubelet's and API server's logs.
    fn fail(&self, what: &str) -> ! {
        panic!(
            "{what}\n--- kubelet log ---\n{}\n--- apiserver log (tail) ---\n{}",
            self.kubelet.log_text(),
            tail(&self.api.log_text(), 40)
        );
    }

    /// Polls `check` until it gives `Some` (within `timeout`).
    fn wait<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut(&Env) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(value) = check(self) {
                return value;
            }
            if !self.kubelet.running() {
                self.fail(&format!("the kubelet exited while waiting for {what}"));
            }
            if Instant::now() > deadline {
                self.fail(&format!("no {what} within {timeout:?}"));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn create_pod(&self, pod: Value) -> Pod {
        let pod: Pod = serde_json::from_value(pod).expect("pod JSON");
        self.rt
            .block_on(self.pods().create(&PostParams::default(), &pod))
            .unwrap_or_else(|e| self.fail(&format!("creating the pod: {e}")))
    }

    fn get_pod(&self, name: &str) -> Option<Pod> {
        self.rt.block_on(self.pods().get_opt(name)).ok().flatten()
    }

    /// Deletes the pod and waits (within `timeout`) until the API server
    /// no longer has it: the kubelet has torn it down.
    fn delete_pod(&mut self, name: &str, timeout: Duration) {
        self.rt
            .block_on(self.pods().delete(name, &DeleteParams::default()))
            .unwrap_or_else(|e| self.fail(&format!("deleting pod {name}: {e}")));
        self.wait(&format!("pod {name} gone"), timeout, |env| {
            env.get_pod(name).is_none().then_some(())
        });
    }

    /// The node's status, once the node is registered.
    fn node_status(&self) -> Option<NodeStatus> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        self.rt
            .block_on(nodes.get_opt(&self.node))
            .ok()
            .flatten()?
            .status
    }

    /// Waits for the pod's phase to be `phase`; the pod.
    fn wait_phase(&mut self, name: &str, phase: &str) -> Pod {
        self.wait(
            &format!("pod {name} {phase}"),
            Duration::from_secs(60),
            |env| env.get_pod(name).filter(|p| pod_phase(p) == Some(phase)),
        )
    }

    /// The containers (and sandboxes: containerd lists their pause
    /// containers too) containerd has, as `ctr` lists them.
    fn ctr_containers(&self) -> Vec<String> {
        let out = Command::new(containerd::bin_dir().join("ctr"))
            .arg("--address")
            .arg(&self.daemon().dirs().socket)
            .args(["-n", containerd::K8S_NAMESPACE, "containers", "ls", "-q"])
            .output()
            .expect("ctr containers ls");
        assert!(
            out.status.success(),
            "ctr: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .filter(|l| !l.is_empty())
            .collect()
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn pod_json(name: &str, node: &str, policy: &str, command: &[&str]) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "nodeName": node,
            "restartPolicy": policy,
            "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": "main",
                "image": IMAGE,
                "command": command,
                "env": [{"name": "GREETING", "value": "hello from the pod spec"}],
            }],
        },
    })
}

fn container_status(pod: &Pod) -> Value {
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.clone())
        .unwrap_or_default();
    assert_eq!(statuses.len(), 1, "one container status: {statuses:?}");
    serde_json::to_value(&statuses[0]).expect("json")
}

fn container_id(pod: &Pod) -> String {
    let status = container_status(pod);
    let id = status["containerID"].as_str().unwrap_or_default();
    id.strip_prefix("containerd://")
        .unwrap_or_else(|| panic!("containerID {id:?} is not containerd://<id>"))
        .to_owned()
}

fn pod_phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref()?.phase.as_deref()
}

fn condition(pod: &Pod, kind: &str) -> Option<String> {
    pod.status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == kind)
        .map(|c| c.status.clone())
}

#[test]
fn node_registers_ready_and_pods_run_their_spec_until_deleted() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Ok(()) = require(&needs(true)) else {
        return;
    };
    let mut env = Env::start("kubelet-a", None);

    // The Node: labels, Ready with heartbeats, capacity, nodeInfo.
    let nodes: Api<Node> = Api::all(env.client.clone());
    let node = env.wait("a Ready node", Duration::from_secs(60), |env| {
        let node = env.rt.block_on(nodes.get_opt(&env.node)).ok().flatten()?;
        (node
            .status
            .as_ref()?
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True"))
        .then_some(node)
    });
    let labels = node.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("kubernetes.io/hostname"), Some(&env.node));
    assert_eq!(
        labels.get("kubernetes.io/os").map(String::as_str),
        Some("linux")
    );
    assert_eq!(
        labels.get("zone").map(String::as_str),
        Some("a"),
        "--node-labels"
    );
    let status = serde_json::to_value(node.status.as_ref().expect("status")).expect("json");
    assert_eq!(status["capacity"]["pods"], "110", "{status}");
    assert!(
        status["capacity"]["cpu"].is_string() && status["allocatable"]["memory"].is_string(),
        "{status}"
    );
    let ready = status["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(ready["reason"], "KubeletReady");
    assert!(ready["lastHeartbeatTime"].is_string(), "{ready}");
    for pressure in ["MemoryPressure", "DiskPressure", "PIDPressure"] {
        assert!(
            status["conditions"].as_array().is_some_and(|c| c
                .iter()
                .any(|c| c["type"] == pressure && c["status"] == "False")),
            "{pressure} False: {status}"
        );
    }
    let runtime = env
        .daemon()
        .version()
        .runtime_version
        .trim_start_matches('v')
        .to_owned();
    assert_eq!(
        status["nodeInfo"]["containerRuntimeVersion"],
        format!("containerd://{runtime}"),
        "the runtime version comes from CRI Version"
    );
    assert_eq!(status["nodeInfo"]["kubeletVersion"], "v1.33.0-tessera-sim");
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").expect("osrelease");
    assert_eq!(status["nodeInfo"]["kernelVersion"], kernel.trim());
    assert!(
        status["addresses"].as_array().is_some_and(|a| a
            .iter()
            .any(|a| a["type"] == "InternalIP" && a["address"] == "127.0.0.1")),
        "{status}"
    );

    // The Lease.
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), "kube-node-lease");
    let lease = env.wait("the node lease", Duration::from_secs(30), |env| {
        env.rt.block_on(leases.get_opt(&env.node)).ok().flatten()
    });
    let spec = lease.spec.expect("lease spec");
    assert_eq!(spec.holder_identity.as_deref(), Some(env.node.as_str()));
    assert_eq!(spec.lease_duration_seconds, Some(40));

    // A pod bound to the node runs, with the pod spec's command and env.
    let before = env.ctr_containers();
    assert!(
        before.is_empty(),
        "a fresh containerd has no containers: {before:?}"
    );
    env.create_pod(pod_json(
        "sleeper",
        "kubelet-a",
        "Always",
        &[
            "/bin/sh",
            "-c",
            "echo \"$GREETING\" > /tmp/greeting; exec sleep 1000",
        ],
    ));
    let pod = env.wait_phase("sleeper", "Running");
    let c = container_status(&pod);
    assert!(c["state"]["running"]["startedAt"].is_string(), "{c}");
    assert_eq!(c["ready"], true);
    assert_eq!(c["restartCount"], 0);
    assert_eq!(c["image"], IMAGE);
    for kind in ["Initialized", "Ready", "ContainersReady", "PodScheduled"] {
        assert_eq!(
            condition(&pod, kind).as_deref(),
            Some("True"),
            "{kind}: {:?}",
            pod.status
        );
    }
    let status = pod.status.clone().expect("status");
    assert_eq!(status.host_ip.as_deref(), Some("127.0.0.1"));
    assert!(
        status.pod_ip.is_some() && status.start_time.is_some(),
        "{status:?}"
    );
    let id = container_id(&pod);
    let info = env
        .daemon()
        .container_status(&id)
        .expect("CRI ContainerStatus");
    assert!(info.running(), "containerd says the container runs");
    let labels: BTreeMap<_, _> = info.status.labels.clone().into_iter().collect();
    assert_eq!(
        labels.get("io.kubernetes.pod.name").map(String::as_str),
        Some("sleeper")
    );
    assert_eq!(
        labels
            .get("io.kubernetes.container.name")
            .map(String::as_str),
        Some("main")
    );
    let out = env.wait("the greeting file", Duration::from_secs(10), |env| {
        env.daemon()
            .exec_sync(&id, &["cat", "/tmp/greeting"], 10)
            .ok()
            .filter(|o| o.exit_code == 0)
    });
    assert_eq!(out.stdout.trim(), "hello from the pod spec");
    let log_dir = env.root.path().join("var/log/pods").join(format!(
        "{NAMESPACE}_sleeper_{}",
        pod.metadata.uid.clone().unwrap_or_default()
    ));
    assert!(log_dir.is_dir(), "{} exists", log_dir.display());
    let running = env.ctr_containers();
    assert_eq!(
        running.len(),
        2,
        "the sandbox and the container: {running:?}"
    );

    // shareProcessNamespace: the containers share the sandbox's pid
    // namespace, whose pid 1 is the sandbox's own process (the image's
    // `/bin/sleep infinity`), not the container's shell; in a pod without
    // it, pid 1 is the container's command (the sleeper's `sleep 1000`).
    let mut shared = pod_json(
        "shared-pid",
        "kubelet-a",
        "Always",
        &["/bin/sh", "-c", "while true; do sleep 1; done"],
    );
    shared["spec"]["shareProcessNamespace"] = json!(true);
    env.create_pod(shared);
    let shared = env.wait_phase("shared-pid", "Running");
    let shared_id = container_id(&shared);
    let init = env
        .daemon()
        .exec_sync(&shared_id, &["cat", "/proc/1/cmdline"], 10)
        .expect("exec");
    assert!(
        init.stdout.starts_with("/bin/sleep"),
        "pid 1 is the sandbox's: {:?}",
        init.stdout
    );
    let own = env
        .daemon()
        .exec_sync(&id, &["cat", "/proc/1/cmdline"], 10)
        .expect("exec");
    assert!(
        own.stdout.starts_with("sleep\u{0}1000"),
        "without it, pid 1 is the container's own: {:?}",
        own.stdout
    );

    // Exit codes under restartPolicy Never.
    env.create_pod(pod_json(
        "ok",
        "kubelet-a",
        "Never",
        &["/bin/sh", "-c", "exit 0"],
    ));
    env.create_pod(pod_json(
        "three",
        "kubelet-a",
        "Never",
        &["/bin/sh", "-c", "exit 3"],
    ));
    let ok = env.wait_phase("ok", "Succeeded");
    assert_eq!(container_status(&ok)["state"]["terminated"]["exitCode"], 0);
    assert_eq!(
        container_status(&ok)["state"]["terminated"]["reason"],
        "Completed"
    );
    let three = env.wait_phase("three", "Failed");
    let t = &container_status(&three)["state"]["terminated"];
    assert_eq!(t["exitCode"], 3, "{t}");
    assert_eq!(t["reason"], "Error", "{t}");
    assert!(t["finishedAt"].is_string(), "{t}");

    // An image the node's containerd does not have: never pulled.
    let mut missing = pod_json("no-image", "kubelet-a", "Always", &["true"]);
    missing["spec"]["containers"][0]["image"] = json!("localhost/tessera-e2e/absent:1");
    env.create_pod(missing);
    let waiting = env.wait("ErrImageNeverPull", Duration::from_secs(30), |env| {
        let pod = env.get_pod("no-image")?;
        let c = pod
            .status
            .as_ref()?
            .container_statuses
            .clone()?
            .first()?
            .clone();
        let w = c.state?.waiting?;
        (w.reason.as_deref() == Some("ErrImageNeverPull")).then_some(w)
    });
    assert!(waiting.message.unwrap_or_default().contains("import"));

    // Deleting a pod: its container and sandbox go, then the pod object.
    let containers_before = env.ctr_containers();
    env.delete_pod("sleeper", Duration::from_secs(60));
    let after = env.ctr_containers();
    assert!(!after.contains(&id), "container {id} removed: {after:?}");
    assert_eq!(
        after.len(),
        containers_before.len() - 2,
        "the container and its sandbox are gone: before {containers_before:?}, after {after:?}"
    );
    let gone = env.daemon().container_status(&id);
    assert!(gone.is_err(), "CRI no longer knows {id}");
    assert!(env.kubelet.running(), "the kubelet still runs");
}

#[test]
fn kubelet_restart_adopts_the_running_pod() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Ok(()) = require(&needs(true)) else {
        return;
    };
    let mut env = Env::start("kubelet-b", None);
    env.create_pod(pod_json(
        "steady",
        "kubelet-b",
        "Always",
        &["sleep", "1000"],
    ));
    let pod = env.wait_phase("steady", "Running");
    let id = container_id(&pod);
    let containers = env.ctr_containers();
    assert_eq!(containers.len(), 2, "{containers:?}");

    env.kubelet.stop();
    // A kubelet that stops leaves its containers running.
    assert!(
        env.daemon()
            .container_status(&id)
            .expect("status")
            .running()
    );
    env.kubelet.spawn().expect("kubelet starts again");
    // Give the new kubelet a few sync rounds.
    let deadline = Instant::now() + Duration::from_secs(6);
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        assert!(
            env.kubelet.running(),
            "kubelet exited:\n{}",
            env.kubelet.log_text()
        );
    }
    let pod = env.get_pod("steady").expect("pod still there");
    assert_eq!(pod_phase(&pod), Some("Running"));
    assert_eq!(container_id(&pod), id, "the same container");
    assert_eq!(container_status(&pod)["restartCount"], 0);
    assert_eq!(
        env.ctr_containers(),
        containers,
        "no second container or sandbox"
    );
    assert!(
        env.kubelet.log_text().contains("adopting"),
        "the kubelet says it adopted the pod"
    );

    // And it still manages it: deletion works through the new kubelet.
    env.delete_pod("steady", Duration::from_secs(60));
    assert!(
        env.ctr_containers().is_empty(),
        "{:?}",
        env.ctr_containers()
    );
}

#[test]
fn dry_run_records_cri_requests_and_pretends() {
    let Ok(()) = require(&needs(false)) else {
        return;
    };
    let record = tempfile::NamedTempFile::new().expect("record file");
    let path: &Path = record.path();
    let mut env = Env::start(
        "kubelet-dry",
        Some(vec!["--dry-run".to_owned(), path.display().to_string()]),
    );
    env.create_pod(pod_json(
        "pretend",
        "kubelet-dry",
        "Always",
        &["/bin/echo", "hi"],
    ));
    let pod = env.wait_phase("pretend", "Running");
    assert_eq!(container_status(&pod)["ready"], true);
    let nodes: Api<Node> = Api::all(env.client.clone());
    let node = env.rt.block_on(nodes.get(&env.node)).expect("node");
    let node_cpus: i128 = node
        .status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref()?.get("cpu"))
        .and_then(|q| q.0.parse().ok())
        .expect("whole cpus in the node's allocatable");
    let runtime = node
        .status
        .and_then(|s| s.node_info)
        .map(|i| i.container_runtime_version);
    assert!(runtime.is_some_and(|r| r.starts_with("tessera-dry-run://")));

    let lines: Vec<Value> = fs::read_to_string(path)
        .expect("record")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let calls: Vec<&str> = lines.iter().filter_map(|l| l["call"].as_str()).collect();
    assert!(calls.starts_with(&["RunPodSandbox"]), "{calls:?}");
    let create = lines
        .iter()
        .find(|l| l["call"] == "CreateContainer")
        .unwrap_or_else(|| panic!("no CreateContainer in {calls:?}"));
    let config = &create["request"]["config"];
    assert_eq!(config["name"], "main");
    assert_eq!(config["image"], IMAGE);
    assert_eq!(config["command"], json!(["/bin/echo", "hi"]));
    assert_eq!(create["request"]["sandbox_config"]["name"], "pretend");
    assert!(calls.contains(&"StartContainer"), "{calls:?}");

    // PodResources lists the running pod, though it holds no devices.
    let socket = env
        .root
        .path()
        .join("var/lib/kubelet/pod-resources/kubelet.sock");
    let listed = env
        .rt
        .block_on(pod_resources_list(&socket))
        .expect("PodResources List");
    let pretend = listed
        .pod_resources
        .iter()
        .find(|p| p.name == "pretend")
        .unwrap_or_else(|| panic!("pretend not listed: {listed:?}"));
    assert_eq!(pretend.namespace, NAMESPACE);
    let names: Vec<&str> = pretend.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["main"]);
    assert!(pretend.containers[0].devices.is_empty(), "{pretend:?}");

    // Admission: an extended resource the node does not list is a
    // cluster-level one (a scheduler extender's): ignored, the pod runs.
    let mut cluster = pod_json("cluster-only", "kubelet-dry", "Always", &["sleep", "1000"]);
    cluster["spec"]["containers"][0]["resources"] = json!({
        "limits": {"example.com/cluster-only": "1000"},
        "requests": {"example.com/cluster-only": "1000"},
    });
    env.create_pod(cluster);
    env.wait_phase("cluster-only", "Running");
    // More cpu than the node has: rejected as kubelet rejects it.
    let mut big = pod_json("too-big", "kubelet-dry", "Never", &["true"]);
    big["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "100000"}});
    env.create_pod(big);
    let failed = env.wait_phase("too-big", "Failed");
    let status = failed.status.clone().expect("status");
    assert_eq!(status.reason.as_deref(), Some("OutOfcpu"), "{status:?}");
    assert_eq!(
        status.message,
        Some(format!(
            "Pod was rejected: Node didn't have enough resource: cpu, requested: 100000000, used: 0, capacity: {}",
            node_cpus * 1000
        ))
    );
    let events: Api<Event> = Api::namespaced(env.client.clone(), NAMESPACE);
    env.wait("the rejection Event", Duration::from_secs(10), |env| {
        let list = env.rt.block_on(events.list(&ListParams::default())).ok()?;
        list.items.into_iter().find(|e| {
            e.involved_object.name.as_deref() == Some("too-big")
                && e.reason.as_deref() == Some("OutOfcpu")
        })
    });

    env.delete_pod("pretend", Duration::from_secs(30));
    let text = fs::read_to_string(path).expect("record");
    for call in [
        "StopContainer",
        "RemoveContainer",
        "StopPodSandbox",
        "RemovePodSandbox",
    ] {
        assert!(
            text.contains(&format!("\"call\":\"{call}\"")),
            "{call} recorded:\n{text}"
        );
    }
}

/// PodResources `List` over the kubelet's socket.
async fn pod_resources_list(
    socket: &Path,
) -> Result<tessera_kube_proto::podresources::v1::ListPodResourcesResponse> {
    use tessera_kube_proto::podresources::v1 as pr;
    let channel = tessera_kube_proto::unix_channel(socket)
        .await
        .context("dialing the PodResources socket")?;
    let mut client = pr::pod_resources_lister_client::PodResourcesListerClient::new(channel);
    Ok(client
        .list(pr::ListPodResourcesRequest {})
        .await
        .context("List")?
        .into_inner())
}

/// A free TCP port on 127.0.0.1 (so a restarted API server keeps its URL).
fn dry_run_calls(path: &Path) -> Vec<Value> {
    fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

#[test]
fn kubelet_survives_api_server_restarts() {
    let Ok(()) = require(&needs(false)) else {
        return;
    };
    let scratch = tempfile::tempdir().expect("scratch");
    let record = scratch.path().join("cri.jsonl");
    let state = scratch.path().join("apiserver-state.json");
    let listen = format!("127.0.0.1:{}", free_port());
    let state_arg = state.display().to_string();
    let mut env = Env::start_with(
        "kubelet-r",
        Some(vec!["--dry-run".to_owned(), record.display().to_string()]),
        &["--listen", &listen, "--state", &state_arg],
    );
    env.create_pod(pod_json(
        "before",
        "kubelet-r",
        "Always",
        &["sleep", "1000"],
    ));
    let before = env.wait_phase("before", "Running");
    let id = container_id_any(&before);

    // A restart that keeps the state: the watch resumes, nothing is lost.
    env.api.restart().expect("API server restarts");
    env.create_pod(pod_json("after", "kubelet-r", "Always", &["sleep", "1000"]));
    env.wait_phase("after", "Running");
    let pod = env.get_pod("before").expect("still there");
    assert_eq!(pod_phase(&pod), Some("Running"));
    assert_eq!(container_id_any(&pod), id, "the same container");
    let creates = dry_run_calls(&record)
        .iter()
        .filter(|c| c["call"] == "CreateContainer")
        .count();
    assert_eq!(creates, 2, "one container per pod, none made twice");
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), "kube-node-lease");
    let renewed = |env: &Env| {
        env.rt
            .block_on(leases.get_opt(&env.node))
            .ok()
            .flatten()
            .and_then(|l| l.spec?.renew_time)
            .map(|t| t.0)
    };
    let first = env.wait("a lease", Duration::from_secs(15), renewed);
    env.wait("a renewed lease", Duration::from_secs(20), |env| {
        renewed(env).filter(|t| *t > first)
    });

    // A restart that loses everything: the node registers again, and the
    // pods the API server no longer has are torn down.
    env.api.stop();
    fs::remove_file(&state).expect("remove the API server's state");
    env.api.restart().expect("API server restarts empty");
    env.wait(
        "the node registered again",
        Duration::from_secs(60),
        |env| env.node_status()?.node_info,
    );
    env.wait("both sandboxes removed", Duration::from_secs(60), |_| {
        let removed = dry_run_calls(&record)
            .iter()
            .filter(|c| c["call"] == "RemovePodSandbox")
            .count();
        (removed == 2).then_some(())
    });
    assert!(env.kubelet.running());
}

fn container_id_any(pod: &Pod) -> String {
    container_status(pod)["containerID"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// The busybox image in podman's store under a tag of this test's own;
/// untagged (and its pods removed) on drop.
struct PodmanImage {
    tag: String,
}

impl PodmanImage {
    fn load() -> Result<PodmanImage> {
        let archive = containerd::busybox_image_archive()?;
        tessera_test_support::run(
            Command::new("podman")
                .args(["load", "-q", "-i"])
                .arg(&archive.path),
        )?;
        let tag = format!(
            "localhost/tessera-e2e/kubelet-podman:{}",
            std::process::id()
        );
        tessera_test_support::run(Command::new("podman").args(["tag", &archive.name, &tag]))?;
        let _ = Command::new("podman")
            // `untag IMAGE NAME`: only the build name goes (without NAME,
            // podman drops every name of the image).
            .args(["untag", &tag, &archive.name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        Ok(PodmanImage { tag })
    }
}

impl Drop for PodmanImage {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .args(["rmi", "-f", &self.tag])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

fn podman_ids(uid: &str) -> Vec<String> {
    let out = Command::new("podman")
        .args(["ps", "-a", "-q", "--no-trunc", "--filter"])
        .arg(format!("label=io.kubernetes.pod.uid={uid}"))
        .output()
        .expect("podman ps");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn podman_mode_runs_pods_and_removes_them() {
    let mut needs = needs(false);
    needs.extend([Need::Root, Need::Program("podman"), Need::Program("tar")]);
    let Ok(()) = require(&needs) else { return };
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let image = PodmanImage::load().expect("busybox image in podman");
    let mut env = Env::start(
        "kubelet-podman",
        Some(
            [
                "--podman",
                "--podman-arg=--runtime=/usr/sbin/runc",
                "--podman-arg=--ulimit=nofile=4096:4096",
                "--podman-arg=--ulimit=nproc=4096:4096",
            ]
            .map(str::to_owned)
            .to_vec(),
        ),
    );
    let mut runner = pod_json(
        "pm-run",
        "kubelet-podman",
        "Always",
        &["/bin/sh", "-c", "exec sleep 1000"],
    );
    runner["spec"]["containers"][0]["image"] = json!(image.tag);
    let mut three = pod_json(
        "pm-three",
        "kubelet-podman",
        "Never",
        &["/bin/sh", "-c", "exit 3"],
    );
    three["spec"]["containers"][0]["image"] = json!(image.tag);
    env.create_pod(runner);
    env.create_pod(three);

    let pod = env.wait_phase("pm-run", "Running");
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let id = container_status(&pod)["containerID"]
        .as_str()
        .and_then(|i| i.strip_prefix("podman://"))
        .unwrap_or_else(|| panic!("containerID podman://<id>: {:?}", pod.status))
        .to_owned();
    let out = Command::new("podman")
        .args(["exec", &id, "/bin/sh", "-c", "echo \"$GREETING\""])
        .output()
        .expect("podman exec");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "hello from the pod spec",
        "podman exec: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let failed = env.wait_phase("pm-three", "Failed");
    assert_eq!(
        container_status(&failed)["state"]["terminated"]["exitCode"],
        3
    );

    env.delete_pod("pm-run", Duration::from_secs(60));
    assert!(
        podman_ids(&uid).is_empty(),
        "the pod's containers are removed"
    );
    env.delete_pod("pm-three", Duration::from_secs(60));
    // A finished pod is deleted at once by the API server (no grace): the
    // kubelet sees it vanish and removes its containers afterwards.
    let failed_uid = failed.metadata.uid.clone().unwrap_or_default();
    env.wait(
        "pm-three's containers removed",
        Duration::from_secs(30),
        |_| podman_ids(&failed_uid).is_empty().then_some(()),
    );
}

/// `example-device-plugin` (tests/src/bin) as a child; killed on drop.
struct PluginProcess(Child);

impl Drop for PluginProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn device_plugin_resources_reach_the_node_and_the_container() {
    let mut needs = needs(false);
    needs.push(Need::Built("example-device-plugin"));
    let Ok(()) = require(&needs) else { return };
    let scratch = tempfile::tempdir().expect("scratch");
    let record = scratch.path().join("cri.jsonl");
    let allocations = scratch.path().join("allocate.jsonl");
    let mut env = Env::start(
        "kubelet-dev",
        Some(vec!["--dry-run".to_owned(), record.display().to_string()]),
    );
    let kubelet_dir = env.root.path().join("var/lib/kubelet");
    env.wait("kubelet.sock", Duration::from_secs(20), |_| {
        kubelet_dir
            .join("device-plugins/kubelet.sock")
            .exists()
            .then_some(())
    });
    let spawn_plugin = || {
        PluginProcess(
            Command::new(artefact("example-device-plugin"))
                .arg("--kubelet-dir")
                .arg(&kubelet_dir)
                .args(["--devices", "2", "--cdi-device", "tessera.io/gpu=0"])
                .arg("--record")
                .arg(&allocations)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("example-device-plugin"),
        )
    };
    let _plugin = spawn_plugin();

    // The plugin's devices show in the node's capacity and allocatable.
    env.wait(
        "example.com/dev on the node",
        Duration::from_secs(30),
        |env| {
            let status = env.node_status()?;
            let cap = status.capacity?.get("example.com/dev")?.0.clone();
            let alloc = status.allocatable?.get("example.com/dev")?.0.clone();
            (cap == "2" && alloc == "2").then_some(())
        },
    );

    // A pod asking for one gets the plugin's answer in CreateContainer.
    let mut pod = pod_json("dev-user", "kubelet-dev", "Always", &["sleep", "1000"]);
    pod["spec"]["containers"][0]["resources"] =
        json!({"limits": {"example.com/dev": "1"}, "requests": {"example.com/dev": "1"}});
    env.create_pod(pod);
    env.wait_phase("dev-user", "Running");
    let calls = dry_run_calls(&record);
    let create = calls
        .iter()
        .find(|c| c["call"] == "CreateContainer")
        .expect("CreateContainer recorded");
    let config = &create["request"]["config"];
    assert_eq!(
        config["cdi_devices"],
        json!(["tessera.io/gpu=0"]),
        "{config}"
    );
    let envs = config["envs"].as_array().cloned().unwrap_or_default();
    assert!(
        envs.iter().any(|e| e[0] == "EXAMPLE_DEV"),
        "the plugin's env: {config}"
    );
    assert!(
        envs.iter().any(|e| e[0] == "GREETING"),
        "the pod's env: {config}"
    );
    assert!(
        config["annotations"]["example.com/dev-ids"].is_string(),
        "the plugin's annotation: {config}"
    );
    let allocate_lines = || {
        fs::read_to_string(&allocations)
            .unwrap_or_default()
            .lines()
            .count()
    };
    assert_eq!(allocate_lines(), 1, "one Allocate");

    // A kubelet restart: the pod keeps its devices (checkpoint), the
    // plugin registers again, nothing is allocated twice.
    env.kubelet.stop();
    env.kubelet.spawn().expect("kubelet again");
    env.wait(
        "example.com/dev back on the node",
        Duration::from_secs(30),
        |env| {
            let status = env.node_status()?;
            (status.capacity?.get("example.com/dev")?.0 == "2").then_some(())
        },
    );
    std::thread::sleep(Duration::from_secs(3));
    let pod = env.get_pod("dev-user").expect("pod");
    assert_eq!(pod_phase(&pod), Some("Running"));
    assert_eq!(allocate_lines(), 1, "no second Allocate after the restart");

    // Deleted, its device is free again: two more pods of one device each fit.
    env.delete_pod("dev-user", Duration::from_secs(30));
    for name in ["dev-a", "dev-b"] {
        let mut pod = pod_json(name, "kubelet-dev", "Always", &["sleep", "1000"]);
        pod["spec"]["containers"][0]["resources"] = json!({"limits": {"example.com/dev": "1"}});
        env.create_pod(pod);
        env.wait_phase(name, "Running");
    }
    let mut third = pod_json("dev-c", "kubelet-dev", "Always", &["sleep", "1000"]);
    third["spec"]["containers"][0]["resources"] = json!({"limits": {"example.com/dev": "1"}});
    env.create_pod(third);
    let failed = env.wait_phase("dev-c", "Failed");
    assert_eq!(
        failed.status.and_then(|s| s.reason).as_deref(),
        Some("UnexpectedAdmissionError")
    );
}

#[test]
fn two_kubelets_on_one_api_server_each_run_only_their_own_pods() {
    let Ok(()) = require(&needs(false)) else {
        return;
    };
    const PODS: usize = 40;
    let scratch = tempfile::tempdir().expect("scratch");
    let record_a = scratch.path().join("a.jsonl");
    let record_b = scratch.path().join("b.jsonl");
    let mut env = Env::start(
        "dry-a",
        Some(vec!["--dry-run".to_owned(), record_a.display().to_string()]),
    );
    let root_b = scratch.path().join("root-b");
    fs::create_dir_all(&root_b).expect("root b");
    let mut kubelet_b = Kubelet::start(
        [
            "--node",
            "dry-b",
            "--root",
            &root_b.display().to_string(),
            "--kubeconfig",
            &env.api.kubeconfig().display().to_string(),
            "--dry-run",
            &record_b.display().to_string(),
        ]
        .map(str::to_owned)
        .to_vec(),
        scratch.path().join("kubelet-b.log"),
    )
    .expect("kubelet b");
    for i in 0..PODS {
        for node in ["dry-a", "dry-b"] {
            env.create_pod(pod_json(
                &format!("{node}-{i}"),
                node,
                "Always",
                &["sleep", "1000"],
            ));
        }
    }
    let pods = env.pods();
    env.wait("every pod Running", Duration::from_secs(120), |env| {
        let list = env.rt.block_on(pods.list(&ListParams::default())).ok()?;
        let running = list
            .items
            .iter()
            .filter(|p| pod_phase(p) == Some("Running"))
            .count();
        (running == 2 * PODS).then_some(())
    });
    assert!(kubelet_b.running(), "kubelet b:\n{}", kubelet_b.log_text());
    for (record, node) in [(&record_a, "dry-a"), (&record_b, "dry-b")] {
        let sandboxes: Vec<String> = dry_run_calls(record)
            .iter()
            .filter(|c| c["call"] == "RunPodSandbox")
            .filter_map(|c| c["request"]["config"]["name"].as_str().map(str::to_owned))
            .collect();
        assert_eq!(
            sandboxes.len(),
            PODS,
            "{node}: one sandbox per pod: {sandboxes:?}"
        );
        assert!(
            sandboxes.iter().all(|s| s.starts_with(&format!("{node}-"))),
            "{node} ran only its own pods: {sandboxes:?}"
        );
    }
    let list = env
        .rt
        .block_on(pods.list(&ListParams::default()))
        .expect("list");
    for pod in &list.items {
        let name = pod.metadata.name.clone().unwrap_or_default();
        env.rt
            .block_on(pods.delete(&name, &DeleteParams::default()))
            .expect("delete");
    }
    env.wait("every pod gone", Duration::from_secs(120), |env| {
        let list = env.rt.block_on(pods.list(&ListParams::default())).ok()?;
        list.items.is_empty().then_some(())
    });
    kubelet_b.stop();
    env.kubelet.stop();
    // A stopped kubelet leaves no device plugin socket behind.
    let socket = env
        .root
        .path()
        .join("var/lib/kubelet/device-plugins/kubelet.sock");
    assert!(!socket.exists(), "{} removed on SIGTERM", socket.display());
}
