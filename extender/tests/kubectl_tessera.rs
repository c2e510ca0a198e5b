//! `kubectl tessera inspect` against the stand-in API server: nodes with
//! `tessera.io/node-gpus` (written here, standing in for the device plugin)
//! and pods with `tessera.io/allocation` (standing in for the extender), then
//! the built `kubectl-tessera` binary, compared with golden files in
//! `tests/golden/`.
//!
//! The goldens were written by hand and checked against this cluster (see
//! [`populate`] for why each figure is what it is). `TESSERA_BLESS=1`
//! rewrites the files that differ and then fails, naming them: a blessing run
//! is never a passing run — review the diff and rerun without it.
//!
//! These tests always start their own stand-in, even when
//! `TESSERA_E2E_KUBECONFIG` names a real cluster: the goldens cover every
//! node of the cluster.

// Helpers of these tests report failures by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::Result;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tessera_model::contract::annotations;
use tessera_model::mig::catalogue;
use tessera_model::mig::placement::Placement;
use tessera_model::sched::inventory::{NodeGpu, NodeGpus};
use tessera_test_support::golden::Goldens;
use tessera_test_support::kube::{self as tkube, StandInApiServer};
use tessera_test_support::require;

const NODE: &str = "gpu-node-1";
const SHARE_UUID: &str = "GPU-11111111-1111-1111-1111-111111111111";
const MIG_UUID: &str = "GPU-22222222-2222-2222-2222-222222222222";

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_kubectl-tessera"))
}

/// `kubectl-tessera <args>` with this kubeconfig.
fn inspect(kubeconfig: &Path, args: &[&str]) -> Output {
    Command::new(binary())
        .arg("inspect")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .env_remove("KUBECONFIG")
        .output()
        .unwrap()
}

fn stdout_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn success(output: Output, what: &str) -> String {
    assert!(
        output.status.success(),
        "{what}: {}\nstderr: {}",
        output.status,
        stderr_of(&output)
    );
    stdout_of(&output)
}

/// A100-SXM4-40GB as the device plugin would report it: 40960 MiB, 108 SMs,
/// and for MIG its profiles with placements from the catalogue.
fn a100(index: u32, uuid: &str, mig: bool) -> NodeGpu {
    let model = catalogue::find("A100-40GB").unwrap();
    NodeGpu::from_catalogue(model, index, uuid, mig).unwrap()
}

async fn add_node(client: &kube::Client, name: &str, inventory: Option<String>) -> Result<()> {
    let mut metadata = json!({"name": name});
    if let Some(inventory) = inventory {
        metadata["annotations"] = json!({annotations::NODE_GPUS: inventory});
    }
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node", "metadata": metadata, "spec": {},
    }))?;
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await?;
    Ok(())
}

async fn add_pod(
    client: &kube::Client,
    ns: &str,
    name: &str,
    allocation: Option<Value>,
    phase: &str,
) -> Result<()> {
    let mut metadata = json!({"name": name, "namespace": ns});
    if let Some(allocation) = allocation {
        let text = match allocation {
            Value::String(s) => s,
            other => other.to_string(),
        };
        metadata["annotations"] = json!({
            annotations::ALLOCATION: text,
            annotations::BIND_PHASE: phase,
        });
    }
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": metadata,
        "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "busybox"}]},
    }))?;
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await?;
    Ok(())
}

fn share(memory: u64, cores: u32) -> Value {
    json!({"node": NODE, "containers": [{"index": 0, "name": "main", "devices": [
        {"uuid": SHARE_UUID, "mode": "share", "memoryMiB": memory, "cores": cores}]}]})
}

fn mig(profile: &str, id: u32, start: u32, size: u32, memory: u64) -> Value {
    json!({"node": NODE, "containers": [{"index": 0, "name": "main", "devices": [
        {"uuid": MIG_UUID, "mode": "mig", "profile": profile, "profileId": id,
         "placement": {"start": start, "size": size}, "memoryMiB": memory}]}]})
}

/// The cluster of every golden:
///
/// - `gpu-node-1`: GPU 0, a share A100 (40960 MiB); GPU 1, a MIG A100.
/// - `gpu-node-2`: an inventory of version 9, unreadable (shown with its error).
/// - `cpu-node`: no inventory, no pods: not shown.
///
/// Pods on `gpu-node-1`:
/// - `default/train-a` share 8000 MiB 30 cores (success) and `default/train-b`
///   share 4000 MiB 20 cores (allocating): GPU 0 holds 12000/40960 MiB,
///   50/100 cores, 2 slices;
/// - `team-b/infer-a` MIG 3g.20gb at slots 0-3 (20096 MiB, 3 compute slices,
///   success) and `team-b/infer-b` 1g.5gb at slot 4 (4864 MiB, 1 slice,
///   allocating): GPU 1 holds 20096 + 4864 = 24960/40960 MiB, 3 + 1 = 4 of 7
///   compute slices = floor(400 / 7) = 57/100 cores, 2 slices, slot map
///   `[3g.20gb:0-3][1g.5gb:4][free:5-7]` (A100's axis has 8 slots);
/// - `default/finished` share 10000 MiB, phase Succeeded: holds nothing;
/// - `default/broken`: an allocation that is not JSON: listed as unreadable;
/// - `default/plain`: no allocation: not shown.
///
/// Cluster: 2 GPUs, 12000 + 24960 = 36960/81920 MiB = 45 %, 50 + 57 =
/// 107/200 cores = 53 %, 4 pods holding GPUs.
async fn populate(kubeconfig: &Path) -> Result<()> {
    let client = tkube::client(kubeconfig).await?;
    let inventory = NodeGpus {
        version: 1,
        gpus: vec![a100(0, SHARE_UUID, false), a100(1, MIG_UUID, true)],
    };
    add_node(&client, NODE, Some(inventory.to_annotation())).await?;
    add_node(
        &client,
        "gpu-node-2",
        Some(r#"{"version":9,"gpus":[]}"#.to_owned()),
    )
    .await?;
    add_node(&client, "cpu-node", None).await?;
    let namespace: Namespace = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-b"}}),
    )?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await?;

    add_pod(
        &client,
        "default",
        "train-a",
        Some(share(8000, 30)),
        "success",
    )
    .await?;
    add_pod(
        &client,
        "default",
        "train-b",
        Some(share(4000, 20)),
        "allocating",
    )
    .await?;
    add_pod(
        &client,
        "team-b",
        "infer-a",
        Some(mig("3g.20gb", 9, 0, 4, 20096)),
        "success",
    )
    .await?;
    add_pod(
        &client,
        "team-b",
        "infer-b",
        Some(mig("1g.5gb", 19, 4, 1, 4864)),
        "allocating",
    )
    .await?;
    add_pod(
        &client,
        "default",
        "finished",
        Some(share(10000, 50)),
        "success",
    )
    .await?;
    Api::<Pod>::namespaced(client.clone(), "default")
        .patch_status(
            "finished",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Succeeded"}})),
        )
        .await?;
    add_pod(
        &client,
        "default",
        "broken",
        Some(Value::String("{\"node\": ".into())),
        "success",
    )
    .await?;
    add_pod(&client, "default", "plain", None, "").await?;
    Ok(())
}

fn started() -> Option<StandInApiServer> {
    if require(&tkube::needs()).is_err() {
        return None;
    }
    Some(StandInApiServer::start(&[]).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_prints_the_reviewed_golden_reports() {
    let Some(server) = started() else { return };
    populate(server.kubeconfig()).await.unwrap();
    let kubeconfig = server.kubeconfig().to_owned();
    let run = move |args: &'static [&'static str]| {
        let kubeconfig = kubeconfig.clone();
        async move {
            tokio::task::spawn_blocking(move || inspect(&kubeconfig, args))
                .await
                .unwrap()
        }
    };
    let mut goldens = Goldens::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden"));
    goldens.check("inspect.txt", &success(run(&[]).await, "inspect"));
    goldens.check("inspect-d.txt", &success(run(&["-d"]).await, "inspect -d"));
    let json_text = success(run(&["-o", "json"]).await, "inspect -o json");
    goldens.check("inspect.json", &json_text);
    goldens.check(
        "inspect-node-n.txt",
        &success(
            run(&[NODE, "--details", "-n", "team-b"]).await,
            "inspect gpu-node-1 -d -n team-b",
        ),
    );
    goldens.finish();

    // The JSON holds the same figures as the table, read independently.
    let report: Value = serde_json::from_str(&json_text).unwrap();
    let gpus = &report["nodes"][0]["gpus"];
    assert_eq!(
        gpus[0]["memoryMiB"],
        json!({"allocated": 12000, "total": 40960})
    );
    assert_eq!(
        gpus[1]["memoryMiB"],
        json!({"allocated": 24960, "total": 40960})
    );
    assert_eq!(gpus[1]["cores"], json!({"allocated": 57, "total": 100}));
    assert_eq!(
        gpus[1]["mig"]["slotMap"],
        "[3g.20gb:0-3][1g.5gb:4][free:5-7]"
    );
    assert_eq!(
        gpus[1]["pods"][1]["placement"],
        json!({"start": 4, "size": 1})
    );
    assert_eq!(report["summary"]["podsHoldingDevices"], 4);
    // Placement round-trips as the model's type.
    let placement: Placement =
        serde_json::from_value(gpus[1]["pods"][0]["placement"].clone()).unwrap();
    assert_eq!(placement, Placement { start: 0, size: 4 });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_one_line_with_their_exit_codes() {
    let Some(mut server) = started() else { return };
    let kubeconfig = server.kubeconfig().to_owned();

    let output = {
        let kubeconfig = kubeconfig.clone();
        tokio::task::spawn_blocking(move || inspect(&kubeconfig, &["no-such-node"]))
            .await
            .unwrap()
    };
    assert_eq!(output.status.code(), Some(1), "{}", stderr_of(&output));
    assert_eq!(
        stderr_of(&output),
        "kubectl-tessera: node no-such-node not found\n"
    );
    assert!(stdout_of(&output).is_empty());

    let output = inspect(&kubeconfig, &["-o", "yaml"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr_of(&output));
    let stderr = stderr_of(&output);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("kubectl-tessera: ") && stderr.contains("yaml"),
        "{stderr}"
    );

    let output = inspect(&kubeconfig, &["--context", "elsewhere"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr_of(&output));
    let stderr = stderr_of(&output);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("elsewhere"), "{stderr}");

    // The kubeconfig's own context works.
    let output = inspect(&kubeconfig, &["--context", "tessera-sim"]);
    assert!(output.status.success(), "{}", stderr_of(&output));
    assert!(
        stdout_of(&output).starts_with("No nodes with GPUs."),
        "{}",
        stdout_of(&output)
    );

    server.stop();
    let output = inspect(&kubeconfig, &[]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr_of(&output));
    let stderr = stderr_of(&output);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("kubectl-tessera: listing nodes: "),
        "{stderr}"
    );
}

/// kubectl finds `kubectl-tessera` on PATH: `kubectl tessera inspect` is the plugin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_runs_it_as_a_plugin() {
    if require(&[tkube::needs(), tkube::kubectl_needs()].concat()).is_err() {
        return;
    }
    let server = StandInApiServer::start(&[]).unwrap();
    populate(server.kubeconfig()).await.unwrap();
    let kubeconfig = server.kubeconfig().to_owned();
    let bin_dir = binary().parent().unwrap().to_owned();
    let path = std::env::join_paths(std::iter::once(bin_dir).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .unwrap();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(tkube::kubectl_path())
            .args(["tessera", "inspect", "--kubeconfig"])
            .arg(&kubeconfig)
            .env("PATH", path)
            .env_remove("KUBECONFIG")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let text = success(output, "kubectl tessera inspect");
    let mut goldens = Goldens::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden"));
    // The same report as the binary run directly.
    goldens.check("inspect.txt", &text);
    goldens.finish();
}

// ---------------------------------------------------------------------------
// TLS: real API servers (in-cluster included) speak https only.

/// A throwaway self-signed CA certificate (P-256, no key kept): enough for
/// the client to build a root store; nothing is ever verified against it.
const TEST_CA_PEM: &str = "-----BEGIN CERTIFICATE-----
MIIBijCCATGgAwIBAgIUBygOMjilMKjPtC6uXOAq2r4VQMAwCgYIKoZIzj0EAwIw
GjEYMBYGA1UEAwwPdGVzc2VyYS10ZXN0LWNhMCAXDTI2MTIwMjAwNDgxNFoYDzIx
MjYxMTA4MDA0ODE0WjAaMRgwFgYDVQQDDA90ZXNzZXJhLXRlc3QtY2EwWTATBgcq
hkjOPQIBBggqhkjOPQMBBwNCAARZHoiblcYVSf7pflYLXwxfqvUAjWIoYMOmQ0RQ
4UKDbNCXAivluxFly9hTfw3A8+uHhMyH3fexTj3Or7DiQp98o1MwUTAdBgNVHQ4E
FgQUowB2QFD3dGr0ow7yeDxOxHK5rcYwHwYDVR0jBBgwFoAUowB2QFD3dGr0ow7y
eDxOxHK5rcYwDwYDVR0TAQH/BAUwAwEB/zAKBggqhkjOPQQDAgNHADBEAiA45ZTd
F8Sq1leWVplg1zQ/N1yCPcWH/ZtsgyAU/TR4pwIgBCjXUxB4DVEQ3kJNRgMiYkYP
UyL4KvFs5DiyB00r+sA=
-----END CERTIFICATE-----
";

/// Writes a kubeconfig for `server` with a bearer token into `dir`; `trust`
/// is the cluster entry's trust line(s) (a CA file, skip-verify, or none).
fn https_kubeconfig(dir: &Path, name: &str, server: &str, trust: &str) -> PathBuf {
    let path = dir.join(name);
    fs::write(
        &path,
        format!(
            "apiVersion: v1
kind: Config
clusters:
  - name: remote
    cluster:
      server: {server}
{trust}contexts:
  - name: remote
    context: {{cluster: remote, user: remote}}
current-context: remote
users:
  - name: remote
    user: {{token: not-a-real-token}}
"
        ),
    )
    .unwrap();
    path
}

/// The three ways a kubeconfig trusts an https server: its CA file (what
/// kubeadm's admin.conf and the in-cluster config do), skip-verify, and the
/// system's roots.
fn https_kubeconfigs(dir: &Path, server: &str) -> Vec<PathBuf> {
    let ca = dir.join("ca.pem");
    fs::write(&ca, TEST_CA_PEM).unwrap();
    vec![
        https_kubeconfig(
            dir,
            "with-ca.yaml",
            server,
            &format!("      certificate-authority: {}\n", ca.display()),
        ),
        https_kubeconfig(
            dir,
            "skip-verify.yaml",
            server,
            "      insecure-skip-tls-verify: true\n",
        ),
        https_kubeconfig(dir, "system-roots.yaml", server, ""),
    ]
}

/// A kube Client is built for an `https://` server (no connection made):
/// the TLS stack is compiled in.
#[tokio::test]
async fn a_client_is_built_for_an_https_server() {
    let dir = tempfile::tempdir().unwrap();
    for path in https_kubeconfigs(dir.path(), "https://api.example.invalid:6443") {
        let file = kube::config::Kubeconfig::read_from(&path).unwrap();
        let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(config.cluster_url.scheme_str(), Some("https"));
        if let Err(e) = kube::Client::try_from(config) {
            panic!("{}: no client for an https server: {e}", path.display());
        }
    }
}

/// `kubectl tessera inspect` against an https URL where nothing listens
/// fails for the connection (exit 1, one line), not for want of TLS.
#[test]
fn inspect_over_https_fails_on_the_connection_not_for_want_of_tls() {
    let dir = tempfile::tempdir().unwrap();
    let port = tessera_test_support::free_port();
    let server = format!("https://127.0.0.1:{port}");
    for path in https_kubeconfigs(dir.path(), &server) {
        let output = inspect(&path, &[]);
        let stderr = stderr_of(&output);
        assert_eq!(
            output.status.code(),
            Some(1),
            "{}: {stderr}",
            path.display()
        );
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        let lower = stderr.to_lowercase();
        assert!(
            !lower.contains("tls required") && !lower.contains("tlsrequired"),
            "{}: {stderr}",
            path.display()
        );
        assert!(
            stderr.starts_with("kubectl-tessera: listing nodes: ")
                && lower.contains("connection refused"),
            "{}: a connection error expected: {stderr}",
            path.display()
        );
    }
}
