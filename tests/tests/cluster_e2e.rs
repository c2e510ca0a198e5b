//! The whole simulated cluster, end to end: `tessera-sim cluster up
//! --detach` with two nodes (each its own simulated GPU node, static
//! `tessera.io/gpu` CDI spec and containerd 1.7), a scheduler configured
//! with the test-only extender (`src/bin/example-extender.rs`) and one
//! test-only device plugin per node (`src/bin/example-device-plugin.rs`,
//! advertising `example.com/dev`). A pod applied with kubectl is filtered,
//! prioritized and bound by the extender, gets its device from the plugin's
//! Allocate, and runs in containerd with the node's `/dev/nvidia0` from that
//! node's CDI spec; deleting it removes the container; a pod no node fits
//! shows a FailedScheduling Event with the extender's reason. `cluster down`
//! with a pod still running leaves no process, container and mount behind.
//!
//! The extender prefers node-2 (`--prefer`): the scheduler's tie-break
//! would pick node-1, so landing on node-2 shows prioritize counted. It is
//! nodeCacheCapable and reads node labels from the API server at each call,
//! so a label set just before a pod is seen by the filter.
//!
//! This test is of `tessera-sim cluster` itself, so it always brings up its
//! own stand-in cluster, `TESSERA_E2E_KUBECONFIG` or not (it reads the
//! nodes' containerd state and container logs from their directories); see
//! docs/cluster-sim.md for the tests that also run against a real cluster.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, ListParams};
use serde_json::Value;
use tessera_test_support::containerd::{self, IMAGE};
use tessera_test_support::kube::{self as kube_support, client, kubectl};
use tessera_test_support::rootfs::{SCRATCH_BASE, scratch_dir};
use tessera_test_support::{Need, artefact, hook_binary, require, run};

const NAMESPACE: &str = "default";
const RESOURCE: &str = "example.com/dev";
const LABEL: &str = "example.com/dev-ok";
/// What the example extender says of a node without the label.
const REASON: &str = "node has no example.com/dev";
/// Devices each example plugin serves.
const DEVICES: usize = 2;
/// The node the extender scores highest (not the name-order first).
const PREFERRED: &str = "node-2";
/// The other node.
const OTHER: &str = "node-1";
/// How long one request to the API server may take in a wait loop.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Processes the test started (extender, device plugins): killed on drop.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The cluster under a scratch root; `cluster down` on drop if the test
/// did not take it down itself.
struct ClusterUp {
    root: PathBuf,
    down: bool,
    _scratch: tempfile::TempDir,
}

impl ClusterUp {
    /// Runs `up` (a `tessera-sim cluster up` command line) detached, under
    /// `root` in `scratch`, with this machine's hook, images and containerd;
    /// the cluster, taken down on drop whatever `up` did, and `up`'s output.
    fn start(
        scratch: tempfile::TempDir,
        root: &Path,
        up: &mut Command,
    ) -> Result<(ClusterUp, std::process::Output)> {
        let output = up
            .arg("--detach")
            .arg("--root")
            .arg(root)
            .arg("--hook-path")
            .arg(hook_binary())
            .arg("--image-dir")
            .arg(Path::new(SCRATCH_BASE).join("images"))
            .arg("--containerd-bin-dir")
            .arg(containerd::bin_dir())
            .stdin(Stdio::null())
            .output()?;
        let cluster = ClusterUp {
            root: root.to_owned(),
            down: false,
            _scratch: scratch,
        };
        Ok((cluster, output))
    }

    fn down(&mut self) -> Result<()> {
        self.down = true;
        run(Command::new(artefact("tessera-sim"))
            .args(["cluster", "down", "--root"])
            .arg(&self.root))?;
        Ok(())
    }

    fn node_dir(&self, node: &str) -> PathBuf {
        self.root.join("nodes").join(node)
    }
}

impl Drop for ClusterUp {
    fn drop(&mut self) {
        if !self.down
            && let Err(e) = self.down()
        {
            eprintln!("cluster down: {e:#}");
        }
    }
}

fn needs() -> Vec<Need> {
    let mut needs = vec![
        Need::Root,
        Need::Built("tessera-sim"),
        Need::Built("tessera-cdi"),
    ];
    needs.extend(containerd::needs());
    needs.extend(kube_support::kubectl_needs());
    needs
}

/// The scheduler configuration naming the example extender at `url`.
fn scheduler_config(url: &str) -> String {
    format!(
        "apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: default-scheduler
extenders:
- urlPrefix: {url}
  filterVerb: filter
  prioritizeVerb: prioritize
  bindVerb: bind
  weight: 1
  nodeCacheCapable: true
  httpTimeout: 10s
  managedResources:
  - name: {RESOURCE}
    ignoredByScheduler: false
"
    )
}

/// A pod asking for one `example.com/dev` that prints what it sees of
/// `/dev/nvidia0` and its env, then sleeps.
fn pod_yaml(name: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {NAMESPACE}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: {IMAGE}
    command: ["sh", "-c", "ls -ln /dev/nvidia0; echo EXAMPLE_DEV=$EXAMPLE_DEV; exec sleep 3600"]
    resources:
      limits:
        {RESOURCE}: 1
"#
    )
}

fn read_lines(path: &Path) -> Vec<Value> {
    fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Polls `check` every 200 ms until it returns `Some` or `timeout` passes
/// (one check that hangs counts as `None` after [`REQUEST_TIMEOUT`]).
async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(v)) = tokio::time::timeout(REQUEST_TIMEOUT, check()).await {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("{what}: not within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// (major, minor) of a device node, read from its inode.
fn major_minor(path: &Path) -> Result<(u64, u64)> {
    let rdev = fs::metadata(path)
        .with_context(|| path.display().to_string())?
        .rdev();
    let major = ((rdev >> 8) & 0xfff) | ((rdev >> 32) & !0xfff);
    let minor = (rdev & 0xff) | ((rdev >> 12) & !0xff);
    Ok((major, minor))
}

fn kubectl_ok(kubeconfig: &Path, args: &[&str]) -> Result<String> {
    let out = run(kubectl(kubeconfig).args(args))?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `kubectl apply -f <manifest>`.
fn apply(kubeconfig: &Path, manifest: &Path) -> Result<String> {
    kubectl_ok(
        kubeconfig,
        &["apply", "-f", &manifest.display().to_string()],
    )
}

/// Waits (60 s at most) for pod `name` to be Running; the pod then.
async fn wait_running(pods: &Api<Pod>, name: &str) -> Result<Pod> {
    wait_for(
        &format!("{name} Running"),
        Duration::from_secs(60),
        || async {
            let p = pods.get(name).await.ok()?;
            (p.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(p)
        },
    )
    .await
}

/// The containerd id of the pod's first container (`containerd://<id>`).
fn first_container_id(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .container_id
        .as_deref()?
        .strip_prefix("containerd://")
        .map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_goes_through_extender_device_plugin_and_containerd_with_a_cdi_device() {
    let Ok(()) = require(&needs()) else { return };
    let started = Instant::now();
    if let Err(e) = scenario().await {
        panic!("{e:#}");
    }
    eprintln!("cluster e2e took {:?}", started.elapsed());
}

async fn scenario() -> Result<()> {
    let scratch = scratch_dir("cluster")?;
    // The cluster's root: new and empty, as `cluster up` wants it; the
    // test's own files go next to it.
    let work = scratch.path().to_owned();
    let root = work.join("c");
    let mut children = Children(Vec::new());

    // The extender first: the scheduler config names its port. It reads the
    // kubeconfig (written by the API server) at its first call.
    let kubeconfig = root.join("kubeconfig");
    let extender_record = work.join("extender.jsonl");
    let address_file = work.join("extender.address");
    children.0.push(
        Command::new(env!("CARGO_BIN_EXE_example-extender"))
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--record")
            .arg(&extender_record)
            .arg("--address-out")
            .arg(&address_file)
            .arg("--prefer")
            .arg(PREFERRED)
            .stderr(fs::File::create(work.join("extender.log"))?)
            .spawn()
            .context("starting example-extender")?,
    );
    let address = wait_for(
        "the extender's address",
        Duration::from_secs(10),
        || async { fs::read_to_string(&address_file).ok() },
    )
    .await?;
    let config = work.join("scheduler.yaml");
    fs::write(&config, scheduler_config(&format!("http://{address}")))?;

    // The cluster.
    let (mut cluster, up) = ClusterUp::start(
        scratch,
        &root,
        Command::new(artefact("tessera-sim"))
            .args(["cluster", "up", "--nodes", "2", "--profile", "demo"])
            .arg("--scheduler-config")
            .arg(&config),
    )?;
    ensure!(
        up.status.success(),
        "cluster up: {}{}",
        String::from_utf8_lossy(&up.stdout),
        String::from_utf8_lossy(&up.stderr)
    );
    let usage = String::from_utf8_lossy(&up.stdout);
    ensure!(
        usage.contains(&format!("export KUBECONFIG={}", kubeconfig.display())),
        "cluster up printed no usage: {usage}"
    );
    let kube = client(&kubeconfig).await?;
    let nodes: Api<Node> = Api::all(kube.clone());
    let pods: Api<Pod> = Api::namespaced(kube.clone(), NAMESPACE);

    // One example device plugin per node, in that node's kubelet directory.
    for node in ["node-1", "node-2"] {
        let kubelet_dir = cluster.node_dir(node).join("var/lib/kubelet");
        children.0.push(
            Command::new(env!("CARGO_BIN_EXE_example-device-plugin"))
                .arg("--kubelet-dir")
                .arg(&kubelet_dir)
                .arg("--devices")
                .arg(DEVICES.to_string())
                .arg("--record")
                .arg(work.join(format!("plugin-{node}.jsonl")))
                .stderr(fs::File::create(work.join(format!("plugin-{node}.log")))?)
                .spawn()
                .context("starting example-device-plugin")?,
        );
    }
    for node in ["node-1", "node-2"] {
        wait_for(
            &format!("{node} allocatable {RESOURCE}"),
            Duration::from_secs(30),
            || async {
                let n = nodes.get(node).await.ok()?;
                let q = n.status?.allocatable?.get(RESOURCE)?.0.clone();
                (q == DEVICES.to_string()).then_some(())
            },
        )
        .await?;
    }
    kubectl_ok(
        &kubeconfig,
        &[
            "label",
            "node",
            "node-1",
            "node-2",
            &format!("{LABEL}=true"),
        ],
    )?;

    // A pod: the extender passes both nodes and scores node-2 highest.
    let pod_file = work.join("pod.yaml");
    fs::write(&pod_file, pod_yaml("dev-pod"))?;
    apply(&kubeconfig, &pod_file)?;
    let pod = wait_running(&pods, "dev-pod")
        .await
        .with_context(|| format!("extender calls: {:?}", read_lines(&extender_record)))?;
    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    ensure!(
        node.as_deref() == Some(PREFERRED),
        "dev-pod should be on {PREFERRED} (the extender's top score), is on {node:?}"
    );

    // The extender saw filter (both nodes pass), prioritize and bind.
    let calls = read_lines(&extender_record);
    let for_pod = |verb: &str| {
        calls
            .iter()
            .filter(|c| c["verb"] == verb && c["pod"] == format!("{NAMESPACE}/dev-pod"))
            .cloned()
            .collect::<Vec<Value>>()
    };
    let filters = for_pod("filter");
    ensure!(!filters.is_empty(), "no filter call for dev-pod: {calls:?}");
    // nodeCacheCapable: the reply names the nodes that passed.
    let passed: Vec<&str> = filters[0]["reply"]["NodeNames"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    ensure!(
        passed.contains(&"node-1") && passed.contains(&"node-2"),
        "filter should pass both labelled nodes: {}",
        filters[0]
    );
    ensure!(
        !for_pod("prioritize").is_empty(),
        "no prioritize call: {calls:?}"
    );
    let binds = for_pod("bind");
    ensure!(
        binds.len() == 1 && binds[0]["node"] == PREFERRED && binds[0]["error"] == "",
        "one successful bind to {PREFERRED} expected: {binds:?}"
    );

    // The preferred node's plugin got one Allocate of one device; the
    // other's none.
    let allocs = read_lines(&work.join(format!("plugin-{PREFERRED}.jsonl")));
    ensure!(
        allocs.len() == 1,
        "Allocate calls on {PREFERRED}: {allocs:?}"
    );
    let ids: Vec<String> = allocs[0]["ids"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    ensure!(ids.len() == 1, "one device id expected: {ids:?}");
    ensure!(
        read_lines(&work.join(format!("plugin-{OTHER}.jsonl"))).is_empty(),
        "{OTHER}'s plugin should not have been asked"
    );

    // containerd ran the container with the CDI device from the node's spec.
    let status = pod.status.clone().unwrap_or_default();
    let container = status
        .container_statuses
        .unwrap_or_default()
        .into_iter()
        .next()
        .context("no container status")?;
    ensure!(
        container
            .state
            .as_ref()
            .and_then(|s| s.running.as_ref())
            .is_some(),
        "container not running: {container:?}"
    );
    let id = container
        .container_id
        .as_deref()
        .and_then(|c| c.strip_prefix("containerd://"))
        .with_context(|| format!("container id {:?}", container.container_id))?
        .to_owned();
    let node_dir = cluster.node_dir(PREFERRED);
    let dirs = containerd::DaemonDirs::new(&node_dir.join("containerd"));
    let bundle = dirs.bundle(&id);
    let oci: Value = serde_json::from_slice(
        &fs::read(bundle.join("config.json")).with_context(|| bundle.display().to_string())?,
    )?;
    let (major, minor) = major_minor(&node_dir.join("dev/nvidia0"))?;
    ensure!(
        (major, minor) == (195, 0),
        "the simulated node's nvidia0 is {major}:{minor}"
    );
    let devices = oci["linux"]["devices"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    ensure!(
        devices.iter().any(|d| d["path"] == "/dev/nvidia0"
            && d["type"] == "c"
            && d["major"] == major
            && d["minor"] == minor),
        "the OCI spec has no /dev/nvidia0 {major}:{minor}: {devices:?}"
    );
    let env = oci["process"]["env"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let want_env = format!("EXAMPLE_DEV={}", ids.join(","));
    ensure!(
        env.iter().any(|e| *e == want_env.as_str()),
        "the OCI spec's env lacks {want_env}: {env:?}"
    );
    // 195:0 is the same on every node: the mounts and the hook show it was
    // this node's static spec that containerd applied.
    check_static_spec_applied(&node_dir, &oci)?;

    // And the container saw it: its log (kubelet's layout under the node).
    let logs = node_dir.join("var/log/pods");
    let output = wait_for(
        "the container's output",
        Duration::from_secs(20),
        || async {
            let text = find_container_log(&logs, "dev-pod")?;
            text.contains("EXAMPLE_DEV=").then_some(text)
        },
    )
    .await?;
    let ls_line = output
        .lines()
        .find(|l| l.contains("/dev/nvidia0"))
        .with_context(|| format!("no ls line in the container's output: {output}"))?;
    // The CRI log line is `<time> stdout F <text>`, the text
    // `crw-rw-rw- 1 0 0 195, 0 <date> /dev/nvidia0`: type and mode, links,
    // uid, gid, then "major," and minor.
    let fields: Vec<&str> = ls_line.split_whitespace().skip(3).collect();
    ensure!(
        fields.first().is_some_and(|f| f.starts_with('c'))
            && fields.get(4) == Some(&format!("{major},").as_str())
            && fields.get(5) == Some(&minor.to_string().as_str()),
        "the container's /dev/nvidia0 is not {major}:{minor}: {ls_line}"
    );
    ensure!(output.contains(&want_env), "container env: {output}");

    // Deleting the pod removes the container and its sandbox from
    // containerd (asked over CRI, not read from its files).
    let sandbox = cri_container_sandbox(&dirs.socket, &id)
        .await?
        .context("dev-pod's container unknown to containerd")?;
    kubectl_ok(
        &kubeconfig,
        &["delete", "pod", "dev-pod", "--wait=true", "--timeout=60s"],
    )?;
    wait_for(
        "the container and sandbox gone from containerd",
        Duration::from_secs(30),
        || async {
            let (containers, sandboxes) = cri_ids(&dirs.socket).await.ok()?;
            (!containers.contains(&id) && !sandboxes.contains(&sandbox)).then_some(())
        },
    )
    .await?;
    ensure!(
        pods.get_opt("dev-pod").await?.is_none(),
        "dev-pod still in the API server after delete"
    );

    // A pod left running at `cluster down`: its process and rootfs mount.
    fs::write(&pod_file, pod_yaml("kept-pod"))?;
    apply(&kubeconfig, &pod_file)?;
    let kept = wait_running(&pods, "kept-pod").await?;
    let kept_id = first_container_id(&kept).context("kept-pod's container id")?;
    let kept_node = kept
        .spec
        .and_then(|s| s.node_name)
        .context("kept-pod's node")?;
    let kept_dirs = containerd::DaemonDirs::new(&cluster.node_dir(&kept_node).join("containerd"));
    let kept_rootfs = kept_dirs.bundle(&kept_id).join("rootfs");
    let kept_pid = cri_container_pid(&kept_dirs.socket, &kept_id).await?;
    ensure!(
        alive(kept_pid),
        "kept-pod's process {kept_pid} is not running"
    );
    // Every process below the cluster's shims: the containers (sandboxes
    // included). The kernel shows a container's /proc/<pid>/root as `/`,
    // so they are found by ancestry.
    let contained = descendants_of_shims_under(&root);
    ensure!(
        contained.contains(&kept_pid),
        "kept-pod's process {kept_pid} is no descendant of a shim: {contained:?}"
    );
    ensure!(
        mount_points().contains(&kept_rootfs),
        "kept-pod's rootfs {} is not mounted",
        kept_rootfs.display()
    );

    // A pod no node fits: the extender fails every node.
    kubectl_ok(
        &kubeconfig,
        &["label", "node", "node-1", "node-2", &format!("{LABEL}-")],
    )?;
    fs::write(&pod_file, pod_yaml("nowhere-pod"))?;
    apply(&kubeconfig, &pod_file)?;
    let events: Api<Event> = Api::namespaced(kube.clone(), NAMESPACE);
    let message = wait_for(
        "FailedScheduling for nowhere-pod",
        Duration::from_secs(30),
        || async {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find_map(|e| {
                (e.reason.as_deref() == Some("FailedScheduling")
                    && e.involved_object.name.as_deref() == Some("nowhere-pod"))
                .then(|| e.message.unwrap_or_default())
            })
        },
    )
    .await?;
    ensure!(
        message.contains(REASON) && message.starts_with("0/2 nodes are available"),
        "FailedScheduling message: {message}"
    );
    // The Event and the pod's condition are two writes; either may land first.
    let p = wait_for(
        "nowhere-pod PodScheduled=False",
        Duration::from_secs(30),
        || async {
            let p = pods.get("nowhere-pod").await.ok()?;
            let unschedulable = p
                .status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .any(|c| c.type_ == "PodScheduled" && c.status == "False");
            unschedulable.then_some(p)
        },
    )
    .await?;
    ensure!(
        p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none(),
        "nowhere-pod was bound"
    );

    // Down, with kept-pod running: nothing left running or mounted under
    // the root, kept-pod's container process and rootfs mount included.
    drop(children);
    cluster.down()?;
    let left = processes_naming(&root);
    ensure!(
        left.is_empty(),
        "processes left after cluster down: {left:?}"
    );
    let survivors: Vec<i32> = contained.iter().copied().filter(|p| alive(*p)).collect();
    ensure!(
        survivors.is_empty(),
        "container processes left after cluster down: {survivors:?}"
    );
    ensure!(
        descendants_of_shims_under(&root).is_empty(),
        "shims left after cluster down"
    );
    ensure!(
        !alive(kept_pid),
        "kept-pod's process {kept_pid} outlived cluster down"
    );
    let mounts: Vec<PathBuf> = mount_points()
        .into_iter()
        .filter(|m| m.starts_with(&root))
        .collect();
    ensure!(
        mounts.is_empty(),
        "mounts left after cluster down: {mounts:?}"
    );
    Ok(())
}

/// Checks that the OCI spec has the mounts of `node_dir`'s static CDI spec
/// (read from the node's CDI directory), every source below `node_dir`, and
/// its hook with the node's own hook config.
fn check_static_spec_applied(node_dir: &Path, oci: &Value) -> Result<()> {
    let spec_path = node_dir
        .join("cdi")
        .join(tessera_model::contract::cdi::STATIC_SPEC_FILE);
    let spec: Value = serde_json::from_slice(
        &fs::read(&spec_path).with_context(|| spec_path.display().to_string())?,
    )?;
    let edits = &spec["containerEdits"];
    let mounts = edits["mounts"].as_array().cloned().unwrap_or_default();
    ensure!(!mounts.is_empty(), "the static spec has no mounts: {spec}");
    let oci_mounts = oci["mounts"].as_array().cloned().unwrap_or_default();
    for m in &mounts {
        let source = m["hostPath"].as_str().unwrap_or_default();
        ensure!(
            Path::new(source).starts_with(node_dir),
            "static spec mount {source} is not below {}",
            node_dir.display()
        );
        ensure!(
            oci_mounts
                .iter()
                .any(|o| o["source"] == source && o["destination"] == m["containerPath"]),
            "the OCI spec lacks the mount of {source}: {oci_mounts:?}"
        );
    }
    let hook_config = node_dir.join("etc/tessera/hook.toml");
    let hooks = oci["hooks"]["createContainer"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    ensure!(
        hooks.iter().any(|h| {
            h["path"] == edits["hooks"][0]["path"]
                && h["args"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|x| x.as_str() == hook_config.to_str()))
        }),
        "the OCI spec lacks the hook with {}: {hooks:?}",
        hook_config.display()
    );
    Ok(())
}

/// A CRI client on a containerd socket.
async fn cri_client(
    socket: &Path,
) -> Result<containerd::cri::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>>
{
    let channel = tessera_e2e::unix_grpc::dial(socket).await?;
    Ok(containerd::cri::runtime_service_client::RuntimeServiceClient::new(channel))
}

/// The ids of every container and every pod sandbox containerd knows of.
async fn cri_ids(socket: &Path) -> Result<(Vec<String>, Vec<String>)> {
    let mut client = cri_client(socket).await?;
    let containers = client
        .list_containers(containerd::cri::ListContainersRequest::default())
        .await?
        .into_inner()
        .containers
        .into_iter()
        .map(|c| c.id)
        .collect();
    let sandboxes = client
        .list_pod_sandbox(containerd::cri::ListPodSandboxRequest::default())
        .await?
        .into_inner()
        .items
        .into_iter()
        .map(|s| s.id)
        .collect();
    Ok((containers, sandboxes))
}

/// The host pid of container `id` (CRI ContainerStatus, verbose info).
async fn cri_container_pid(socket: &Path, id: &str) -> Result<i32> {
    let mut client = cri_client(socket).await?;
    let response = client
        .container_status(containerd::cri::ContainerStatusRequest {
            container_id: id.to_owned(),
            verbose: true,
        })
        .await?
        .into_inner();
    let info: Value = serde_json::from_str(response.info.get("info").context("no verbose info")?)?;
    let pid = info["pid"]
        .as_i64()
        .with_context(|| format!("no pid: {info}"))?;
    ensure!(pid > 0, "pid {pid}");
    Ok(i32::try_from(pid)?)
}

/// The sandbox of container `id`, as containerd lists it.
async fn cri_container_sandbox(socket: &Path, id: &str) -> Result<Option<String>> {
    let mut client = cri_client(socket).await?;
    Ok(client
        .list_containers(containerd::cri::ListContainersRequest::default())
        .await?
        .into_inner()
        .containers
        .into_iter()
        .find(|c| c.id == id)
        .map(|c| c.pod_sandbox_id))
}

/// Mount points of this mount namespace (mountinfo's octal escapes undone).
fn mount_points() -> Vec<PathBuf> {
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| {
            PathBuf::from(
                m.replace("\\040", " ")
                    .replace("\\011", "\t")
                    .replace("\\012", "\n")
                    .replace("\\134", "\\"),
            )
        })
        .collect()
}

/// Live containerd shims (program `containerd-shim*`) with an argument
/// below `root`, and all their descendants.
fn descendants_of_shims_under(root: &Path) -> Vec<i32> {
    let pids: Vec<i32> = fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .collect();
    let args = |pid: i32| -> Vec<String> {
        fs::read(format!("/proc/{pid}/cmdline"))
            .unwrap_or_default()
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect()
    };
    let parent = |pid: i32| -> Option<i32> {
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat[stat.rfind(')')? + 1..]
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    let mut found: Vec<i32> = pids
        .iter()
        .copied()
        .filter(|pid| {
            let a = args(*pid);
            a.first().is_some_and(|a0| {
                a0.rsplit('/')
                    .next()
                    .is_some_and(|n| n.starts_with("containerd-shim"))
            }) && a.iter().any(|x| Path::new(x).starts_with(root))
        })
        .collect();
    loop {
        let more: Vec<i32> = pids
            .iter()
            .copied()
            .filter(|p| !found.contains(p) && parent(*p).is_some_and(|pp| found.contains(&pp)))
            .collect();
        if more.is_empty() {
            break;
        }
        found.extend(more);
    }
    found.into_iter().filter(|p| alive(*p)).collect()
}

/// The text of the log of the first container of pod `name` in kubelet's
/// `/var/log/pods/<namespace>_<name>_<uid>/<container>/<n>.log` layout.
fn find_container_log(logs: &Path, name: &str) -> Option<String> {
    let prefix = format!("{NAMESPACE}_{name}_");
    let pod_dir = fs::read_dir(logs)
        .ok()?
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with(&prefix))?
        .path();
    let container_dir = pod_dir.join("main");
    let file = fs::read_dir(container_dir)
        .ok()?
        .flatten()
        .find(|e| e.file_name().to_string_lossy().ends_with(".log"))?
        .path();
    fs::read_to_string(file).ok()
}

/// Pids of processes with `root` (or a path below it) on their command line.
fn processes_naming(root: &Path) -> Vec<String> {
    let root = root.display().to_string();
    fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|e| {
            let cmdline = fs::read(e.path().join("cmdline")).ok()?;
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            text.contains(&root)
                .then(|| format!("{}: {text}", e.file_name().to_string_lossy()))
        })
        .collect()
}

/// Starts `cluster up` in the foreground (dry-run nodes) and waits until
/// its state says ready; returns the child and the state.
/// It runs in a process group of its own, as a shell's foreground job does.
fn foreground_up(root: &Path, nodes: u32) -> Result<(Child, Value)> {
    let child = std::os::unix::process::CommandExt::process_group(
        Command::new(artefact("tessera-sim"))
            .args(["cluster", "up", "--runtime", "dry-run", "--nodes"])
            .arg(nodes.to_string())
            .arg("--root")
            .arg(root)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(root.with_extension("log"))?),
        0,
    )
    .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(text) = fs::read(root.join("cluster.json"))
            && let Ok(state) = serde_json::from_slice::<Value>(&text)
            && state["ready"] == true
        {
            return Ok((child, state));
        }
        ensure!(
            Instant::now() < deadline,
            "not ready in 60 s: {}",
            fs::read_to_string(root.with_extension("log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn service_pids(state: &Value) -> Vec<i32> {
    state["services"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["pid"].as_i64().and_then(|p| i32::try_from(p).ok()))
        .collect()
}

fn alive(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rfind(')')
            .and_then(|i| s[i + 1..].split_whitespace().next())
            .is_some_and(|state| state != "Z")
    })
}

#[test]
fn ctrl_c_on_a_foreground_cluster_stops_every_service() {
    let Ok(()) = require(&[Need::Root, Need::Built("tessera-sim")]) else {
        return;
    };
    let scratch = scratch_dir("cluster-int").expect("scratch");
    let root = scratch.path().join("c");
    fs::create_dir_all(&root).expect("root");
    let (mut child, state) = foreground_up(&root, 3).expect("cluster up");
    let pids = service_pids(&state);
    assert_eq!(pids.len(), 5, "apiserver, scheduler, 3 kubelets: {state}");
    assert!(pids.iter().all(|p| alive(*p)), "{state}");
    // A user's program naming the root is none of the cluster's business.
    let mut tail = Command::new("tail")
        .arg("-f")
        .arg(root.join("logs/apiserver.log"))
        .stdout(Stdio::null())
        .spawn()
        .expect("tail");
    // What a terminal's Ctrl-C does: SIGINT to the whole foreground
    // process group (the services, in groups of their own, are spared).
    let pgid =
        rustix::process::Pid::from_raw(i32::try_from(child.id()).expect("pid")).expect("pid");
    rustix::process::kill_process_group(pgid, rustix::process::Signal::INT).expect("SIGINT");
    let status = child.wait().expect("wait");
    assert!(status.success(), "cluster up exited with {status}");
    assert!(pids.iter().all(|p| !alive(*p)), "services left: {pids:?}");
    let tail_pid = i32::try_from(tail.id()).expect("pid");
    assert!(alive(tail_pid), "the teardown killed a user's tail -f");
    let _ = tail.kill();
    let _ = tail.wait();
    let left = processes_naming(&root);
    assert!(left.is_empty(), "processes left: {left:?}");
}

#[test]
fn down_cleans_up_after_a_supervisor_that_was_killed() {
    let Ok(()) = require(&[Need::Root, Need::Built("tessera-sim")]) else {
        return;
    };
    let scratch = scratch_dir("cluster-kill").expect("scratch");
    let root = scratch.path().join("c");
    fs::create_dir_all(&root).expect("root");
    let (mut child, state) = foreground_up(&root, 2).expect("cluster up");
    let pids = service_pids(&state);
    child.kill().expect("SIGKILL the supervisor");
    let _ = child.wait();
    assert!(
        pids.iter().all(|p| alive(*p)),
        "the services outlive a killed supervisor (their own process groups)"
    );
    let status = Command::new(artefact("tessera-sim"))
        .args(["cluster", "status", "--root"])
        .arg(&root)
        .output()
        .expect("status");
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.contains("GONE"),
        "status should say the supervisor is gone: {text}"
    );
    // Its services still run: another `up` on the root is refused.
    let again = Command::new(artefact("tessera-sim"))
        .args(["cluster", "up", "--runtime", "dry-run", "--root"])
        .arg(&root)
        .output()
        .expect("cluster up");
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(
        !again.status.success() && err.contains("still run") && err.contains("cluster down"),
        "a second up should be refused: {} {err}",
        again.status
    );
    run(Command::new(artefact("tessera-sim"))
        .args(["cluster", "down", "--root"])
        .arg(&root))
    .expect("cluster down");
    assert!(pids.iter().all(|p| !alive(*p)), "services left: {pids:?}");
    let left = processes_naming(&root);
    assert!(left.is_empty(), "processes left: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn down_after_a_killed_supervisor_stops_containerd_and_its_containers() {
    let Ok(()) = require(&needs()) else { return };
    if let Err(e) = killed_supervisor_with_containerd().await {
        panic!("{e:#}");
    }
}

/// One containerd node with a pod running; the supervisor SIGKILLed; then
/// `cluster down` must stop the kubelet, containerd, its shims and the
/// container, and unmount the container's rootfs.
async fn killed_supervisor_with_containerd() -> Result<()> {
    let scratch = scratch_dir("cluster-kill-ctrd")?;
    let root = scratch.path().join("c");
    let (mut cluster, up) = ClusterUp::start(
        scratch,
        &root,
        Command::new(artefact("tessera-sim")).args(["cluster", "up", "--nodes", "1"]),
    )?;
    ensure!(
        up.status.success(),
        "cluster up: {}",
        String::from_utf8_lossy(&up.stderr)
    );
    let kubeconfig = root.join("kubeconfig");
    let pods: Api<Pod> = Api::namespaced(client(&kubeconfig).await?, NAMESPACE);
    let pod_file = root.with_extension("pod.yaml");
    fs::write(
        &pod_file,
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: sleeper\nspec:\n  containers:\n  - name: main\n    image: {IMAGE}\n    command: [\"sleep\", \"3600\"]\n"
        ),
    )?;
    apply(&kubeconfig, &pod_file)?;
    let pod = wait_running(&pods, "sleeper").await?;
    let id = first_container_id(&pod).context("sleeper's container id")?;
    let dirs = containerd::DaemonDirs::new(&cluster.node_dir("node-1").join("containerd"));
    let pid = cri_container_pid(&dirs.socket, &id).await?;
    let rootfs = dirs.bundle(&id).join("rootfs");
    ensure!(mount_points().contains(&rootfs), "rootfs not mounted");
    let contained = descendants_of_shims_under(&root);
    ensure!(
        contained.contains(&pid),
        "{pid} not below a shim: {contained:?}"
    );

    let state: Value = serde_json::from_slice(&fs::read(root.join("cluster.json"))?)?;
    let services = service_pids(&state);
    let supervisor = state["supervisorPid"]
        .as_i64()
        .and_then(|p| i32::try_from(p).ok())
        .context("supervisor pid")?;
    let supervisor_pid = rustix::process::Pid::from_raw(supervisor).context("pid")?;
    rustix::process::kill_process(supervisor_pid, rustix::process::Signal::KILL)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(supervisor) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ensure!(!alive(supervisor), "the supervisor survived SIGKILL");
    ensure!(alive(pid), "the container died with the supervisor");

    cluster.down()?;
    let left: Vec<i32> = services
        .iter()
        .chain(&contained)
        .copied()
        .filter(|p| alive(*p))
        .collect();
    ensure!(left.is_empty(), "left running after down: {left:?}");
    let left = processes_naming(&root);
    ensure!(left.is_empty(), "processes left: {left:?}");
    let mounts: Vec<PathBuf> = mount_points()
        .into_iter()
        .filter(|m| m.starts_with(&root))
        .collect();
    ensure!(mounts.is_empty(), "mounts left: {mounts:?}");
    Ok(())
}
