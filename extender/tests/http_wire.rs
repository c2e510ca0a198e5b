//! The extender's HTTP verbs with the exact wire JSON, against the stand-in
//! API server: filter (NodeNames and Nodes forms), prioritize, malformed
//! bodies, unknown nodes, corrupt and foreign annotations, config errors,
//! metrics and the inspect report.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{
    ExtenderProcess, args_with_names, error_of, gpu_pod, put_node, put_pod, put_share_node,
    share_allocation,
};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use serde_json::{Value, json};

/// Keys of a JSON object, sorted.
fn keys(value: &Value) -> Vec<String> {
    let mut keys: Vec<String> = value
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    keys.sort();
    keys
}

fn failed(reply: &Value, node: &str) -> String {
    reply["FailedNodes"][node]
        .as_str()
        .unwrap_or("")
        .to_string()
}

fn unresolvable(reply: &Value, node: &str) -> String {
    reply["FailedAndUnresolvableNodes"][node]
        .as_str()
        .unwrap_or("")
        .to_string()
}

/// Nodes: `ok` (one A100-40GB in share mode), `bare` (no inventory),
/// `corrupt` (not JSON), `future` (inventory version 2).
async fn four_nodes(client: &kube::Client) {
    put_share_node(client, "ok", 1).await;
    put_node(client, "bare", None).await;
    put_node(
        client,
        "corrupt",
        Some("{\"version\":1,\"gpus\":[{\"uuid\":"),
    )
    .await;
    put_node(
        client,
        "future",
        Some(r#"{"version":2,"gpus":[],"slots":{}}"#),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn filter_answers_in_the_form_it_was_asked_with_a_reason_per_failed_node() {
    let Some((server, client)) = common::api().await else {
        return;
    };
    four_nodes(&client).await;
    let extender = ExtenderProcess::start(server.kubeconfig(), &[]).expect("extender");
    let pod = put_pod(&client, &gpu_pod("train", 1, 8000, None, &[])).await;

    // nodeCacheCapable: names in, names out.
    let reply = extender.filter(&pod, &["ok", "bare", "corrupt", "future", "ghost"]);
    assert_eq!(
        keys(&reply),
        [
            "Error",
            "FailedAndUnresolvableNodes",
            "FailedNodes",
            "NodeNames"
        ],
        "{reply}"
    );
    assert_eq!(reply["NodeNames"], json!(["ok"]), "{reply}");
    assert_eq!(reply["Error"], "");
    // No pod leaving these nodes would help: unresolvable, not FailedNodes.
    assert_eq!(reply["FailedNodes"], json!({}), "{reply}");
    assert!(
        unresolvable(&reply, "bare").contains("tessera.io/node-gpus"),
        "{reply}"
    );
    assert!(
        unresolvable(&reply, "corrupt").contains("tessera.io/node-gpus"),
        "{reply}"
    );
    assert!(
        unresolvable(&reply, "future").contains("version 2"),
        "{reply}"
    );
    assert_eq!(
        unresolvable(&reply, "ghost"),
        "node unknown to the extender"
    );

    // Whole Node objects in, objects out.
    let nodes: Vec<Node> = {
        let api: Api<Node> = Api::all(client.clone());
        let mut nodes = Vec::new();
        for name in ["ok", "bare", "future"] {
            nodes.push(api.get(name).await.expect("node"));
        }
        nodes
    };
    let (status, reply) = extender.post(
        "/filter",
        &json!({"Pod": pod, "Nodes": {"metadata": {}, "items": nodes}}),
    );
    assert_eq!(status, 200, "{reply}");
    assert_eq!(
        keys(&reply),
        [
            "Error",
            "FailedAndUnresolvableNodes",
            "FailedNodes",
            "Nodes"
        ],
        "{reply}"
    );
    let passed: Vec<&str> = reply["Nodes"]["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|n| n["metadata"]["name"].as_str())
        .collect();
    assert_eq!(passed, ["ok"], "{reply}");
    assert_eq!(
        keys(&reply["FailedAndUnresolvableNodes"]),
        ["bare", "future"],
        "{reply}"
    );

    // Both calls were timed.
    let metrics = extender.metrics();
    assert!(
        metrics.contains("tessera_extender_verb_duration_seconds_count{verb=\"filter\"} 2"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_without_gpus_passes_every_node_and_a_bad_ask_fails_them_all() {
    let Some((server, client)) = common::api().await else {
        return;
    };
    four_nodes(&client).await;
    let extender = ExtenderProcess::start(server.kubeconfig(), &[]).expect("extender");
    let plain = put_pod(&client, &common::plain_pod("web")).await;
    let reply = extender.filter(&plain, &["ok", "bare", "ghost"]);
    assert_eq!(
        reply["NodeNames"],
        json!(["ok", "bare", "ghost"]),
        "{reply}"
    );
    assert_eq!(reply["FailedNodes"], json!({}));

    // gpumem "0.5" is no whole number: every node fails, unresolvably, naming the resource.
    let mut bad = gpu_pod("bad", 1, 1, None, &[]);
    if let Some(spec) = bad.spec.as_mut()
        && let Some(limits) = spec.containers[0]
            .resources
            .as_mut()
            .and_then(|r| r.limits.as_mut())
    {
        limits.insert(
            "nvidia.com/gpumem".into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("0.5".into()),
        );
    }
    let reply = extender.filter(&bad, &["ok", "bare"]);
    assert_eq!(reply["NodeNames"], json!([]), "{reply}");
    for node in ["ok", "bare"] {
        let reason = reply["FailedAndUnresolvableNodes"][node]
            .as_str()
            .unwrap_or("");
        assert!(reason.contains("nvidia.com/gpumem"), "{node}: {reply}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_bodies_get_400_with_one_line() {
    let Some((server, _client)) = common::api().await else {
        return;
    };
    let extender = ExtenderProcess::start(server.kubeconfig(), &[]).expect("extender");
    let cases = [
        ("/filter", "not json"),
        ("/filter", "[]"),
        ("/filter", "{\"NodeNames\":[\"a\"]}"),
        (
            "/filter",
            "{\"Pod\":{\"metadata\":{\"name\":7}},\"NodeNames\":[]}",
        ),
        ("/prioritize", "{\"Pod\":{},\"NodeNames\":[1,2]}"),
        ("/prioritize", ""),
        ("/bind", "{\"PodName\":\"p\"}"),
        (
            "/bind",
            "{\"PodName\":\"p\",\"PodNamespace\":\"d\",\"PodUID\":3,\"Node\":\"n\"}",
        ),
    ];
    for (path, body) in cases {
        let (status, text) = common::http(&extender.address, "POST", path, body).expect("answer");
        assert_eq!(status, 400, "{path} {body:?}: {text}");
        assert_eq!(text.trim().lines().count(), 1, "{text}");
        let reply: Value = serde_json::from_str(&text).expect("JSON error");
        assert!(!error_of(&reply).is_empty(), "{text}");
    }
    // Still serving.
    assert_eq!(
        common::http(&extender.address, "GET", "/healthz", "")
            .expect("health")
            .0,
        200
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn prioritize_scores_fitting_nodes_and_gives_the_others_zero() {
    let Some((server, client)) = common::api().await else {
        return;
    };
    put_share_node(&client, "empty", 1).await;
    put_share_node(&client, "busy", 1).await;
    put_node(&client, "bare", None).await;
    // A pod already holding 20000 MiB of busy's GPU (written as the extender would).
    let holder = gpu_pod("holder", 1, 20000, None, &[]);
    let mut holder = holder;
    holder.metadata.annotations = Some(BTreeMap::from([(
        "tessera.io/allocation".to_string(),
        share_allocation("busy", 20000),
    )]));
    put_pod(&client, &holder).await;
    let extender = ExtenderProcess::start(server.kubeconfig(), &[]).expect("extender");
    let pod = put_pod(&client, &gpu_pod("next", 1, 8000, None, &[])).await;
    // The reflector must have seen the holder first.
    let mut scores = BTreeMap::new();
    for _ in 0..50 {
        let (status, reply) = extender.post(
            "/prioritize",
            &args_with_names(&pod, &["empty", "busy", "bare", "ghost"]),
        );
        assert_eq!(status, 200, "{reply}");
        let list = reply.as_array().expect("a HostPriorityList").clone();
        assert_eq!(list.len(), 4, "{reply}");
        scores = list
            .iter()
            .map(|h| {
                assert_eq!(keys(h), ["Host", "Score"], "{reply}");
                (
                    h["Host"].as_str().unwrap_or("").to_string(),
                    h["Score"].as_i64().unwrap_or(-1),
                )
            })
            .collect();
        if scores["busy"] != scores["empty"] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(scores["bare"], 0);
    assert_eq!(scores["ghost"], 0);
    for node in ["empty", "busy"] {
        assert!((0..=10).contains(&scores[node]), "{scores:?}");
    }
    // Default node policy binpack: the fuller node scores higher.
    assert!(scores["busy"] > scores["empty"], "{scores:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn corrupt_or_foreign_allocations_make_their_node_unusable() {
    let Some((server, client)) = common::api().await else {
        return;
    };
    for node in ["clean", "hand-edited", "foreign"] {
        put_share_node(&client, node, 1).await;
    }
    let with_allocation = |name: &str, node: &str, text: &str| {
        let mut pod = gpu_pod(name, 1, 1000, None, &[]);
        pod.metadata.annotations = Some(BTreeMap::from([(
            "tessera.io/allocation".to_string(),
            text.to_string(),
        )]));
        if let Some(spec) = pod.spec.as_mut() {
            spec.node_name = Some(node.to_string());
        }
        pod
    };
    put_pod(&client, &with_allocation("edited", "hand-edited", "{\"node\":\"hand-edited\",\"containers\":[{\"index\":0,\"name\":\"main\",\"devices\":[{\"mode\":\"share\",\"uuid\":\"GPU-A100-40GB-0-0000\",\"memoryMiB\":\"lots\"}]}]}")).await;
    put_pod(
        &client,
        &with_allocation(
            "alien",
            "foreign",
            r#"{"version":9,"node":"foreign","grants":[]}"#,
        ),
    )
    .await;
    let extender = ExtenderProcess::start(server.kubeconfig(), &[]).expect("extender");
    let pod = put_pod(&client, &gpu_pod("next", 1, 1000, None, &[])).await;
    let reply = extender.filter(&pod, &["clean", "hand-edited", "foreign"]);
    assert_eq!(reply["NodeNames"], json!(["clean"]), "{reply}");
    assert!(
        failed(&reply, "hand-edited").contains("default/edited"),
        "{reply}"
    );
    assert!(
        failed(&reply, "foreign").contains("default/alien"),
        "{reply}"
    );
    assert!(failed(&reply, "foreign").contains("version 9"), "{reply}");
    let (status, reply) = extender.post(
        "/prioritize",
        &args_with_names(&pod, &["clean", "hand-edited", "foreign"]),
    );
    assert_eq!(status, 200);
    for h in reply.as_array().expect("list") {
        if h["Host"] != "clean" {
            assert_eq!(h["Score"], 0, "{reply}");
        }
    }
}

/// Runs the extender with `args`, which it must refuse: exit code 2 and one
/// line on stderr, returned.
fn refused<I, S>(args: I) -> String
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tessera-scheduler-extender"))
        .args(args)
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    stderr
}

#[test]
fn a_bad_config_exits_2_with_one_line_naming_the_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "nvidia:\n  deviceMemoryScaling: -1\n").expect("write");
    let stderr = refused([
        "--config".as_ref(),
        bad.as_os_str(),
        "--kubeconfig".as_ref(),
        "/nonexistent".as_ref(),
        "--listen".as_ref(),
        "127.0.0.1:0".as_ref(),
    ]);
    assert!(stderr.contains("deviceMemoryScaling"), "{stderr}");

    std::fs::write(&bad, "nvidia:\n  deviceSplitCount: 4\n  colour: blue\n").expect("write");
    let stderr = refused(["--config".as_ref(), bad.as_os_str()]);
    assert!(stderr.contains("colour"), "{stderr}");

    let stderr = refused([
        "--config".as_ref(),
        dir.path().join("missing.yaml").as_os_str(),
    ]);
    assert!(stderr.contains("missing.yaml"), "{stderr}");

    refused(["--lock-wait", "soon"]);
}

#[test]
fn healthy_but_not_ready_without_an_api_server_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A kubeconfig naming a port nobody listens on.
    let dead = tessera_test_support::free_port();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:{dead}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\nusers:\n- name: u\n  user: {{}}\ncurrent-context: c\n"
        ),
    )
    .expect("kubeconfig");
    let address = format!("127.0.0.1:{}", tessera_test_support::free_port());
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tessera-scheduler-extender"))
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["--listen", &address, "--log-format", "json"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starts");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while common::http(&address, "GET", "/healthz", "")
        .map(|r| r.0)
        .ok()
        != Some(200)
    {
        assert!(std::time::Instant::now() < deadline, "never healthy");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (status, _) = common::http(&address, "GET", "/readyz", "").expect("readyz");
    assert_eq!(status, 503, "not ready while nothing is synced");
    // Until synced, a GPU pod's filter is an Error (kube-scheduler retries)
    // rather than every node failing as unknown; a pod without GPUs passes.
    let pod = gpu_pod("early", 1, 1000, None, &[]);
    let (status, text) = common::http(
        &address,
        "POST",
        "/filter",
        &args_with_names(&pod, &["n1"]).to_string(),
    )
    .expect("filter");
    assert_eq!(status, 200, "{text}");
    let reply: Value = serde_json::from_str(&text).expect("JSON");
    assert!(error_of(&reply).contains("not synced"), "{reply}");
    assert_eq!(reply["NodeNames"], json!([]), "{reply}");
    assert_eq!(reply["FailedNodes"], json!({}), "{reply}");
    let plain = common::plain_pod("web");
    let (_, text) = common::http(
        &address,
        "POST",
        "/filter",
        &args_with_names(&plain, &["n1"]).to_string(),
    )
    .expect("filter");
    let reply: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(reply["NodeNames"], json!(["n1"]), "{reply}");
    assert_eq!(reply["Error"], "", "{reply}");
    let pid = rustix::process::Pid::from_child(&child);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still running 10 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr)
        .expect("read");
    for line in stderr.lines() {
        let record: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(record.get("level").is_some(), "{line}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_ask_no_empty_node_could_take_is_unresolvable_and_a_shortfall_is_not() {
    let Some((server, client)) = common::api().await else {
        return;
    };
    for node in ["small", "busy"] {
        put_share_node(&client, node, 1).await;
    }
    // busy's GPU already holds 30000 of its 40960 MiB.
    let mut holder = gpu_pod("holder", 1, 30000, None, &[]);
    holder.metadata.annotations = Some(BTreeMap::from([(
        "tessera.io/allocation".to_string(),
        share_allocation("busy", 30000),
    )]));
    if let Some(spec) = holder.spec.as_mut() {
        spec.node_name = Some("busy".into());
    }
    put_pod(&client, &holder).await;
    let extender = ExtenderProcess::start(server.kubeconfig(), &[]).expect("extender");
    // 50000 MiB is more than an A100-40GB has (40960): no eviction helps.
    let huge = put_pod(&client, &gpu_pod("huge", 1, 50000, None, &[])).await;
    let reply = extender.filter(&huge, &["small", "busy"]);
    assert_eq!(reply["NodeNames"], json!([]), "{reply}");
    assert_eq!(reply["FailedNodes"], json!({}), "{reply}");
    assert_eq!(
        keys(&reply["FailedAndUnresolvableNodes"]),
        ["busy", "small"],
        "{reply}"
    );
    // 20000 MiB fits small, and busy only once the holder leaves.
    let medium = put_pod(&client, &gpu_pod("medium", 1, 20000, None, &[])).await;
    let reply = extender.filter(&medium, &["small", "busy"]);
    assert_eq!(reply["NodeNames"], json!(["small"]), "{reply}");
    assert!(!failed(&reply, "busy").is_empty(), "{reply}");
    assert_eq!(reply["FailedAndUnresolvableNodes"], json!({}), "{reply}");
}

#[tokio::test(flavor = "multi_thread")]
async fn large_bodies_are_read_and_bodies_over_the_limit_get_a_json_413() {
    let Some((server, client)) = common::api().await else {
        return;
    };
    put_share_node(&client, "ok", 1).await;
    let extender = ExtenderProcess::start(server.kubeconfig(), &[]).expect("extender");
    let pod = put_pod(&client, &gpu_pod("train", 1, 8000, None, &[])).await;
    // Without nodeCacheCapable: 400 whole Node objects of ~8 KiB each, over
    // 3 MB, past the 2 MB many HTTP frameworks stop at.
    let node = Api::<Node>::all(client.clone())
        .get("ok")
        .await
        .expect("node");
    let padding = "x".repeat(8 * 1024);
    let items: Vec<Value> = (0..400)
        .map(|i| {
            let mut copy = serde_json::to_value(&node).expect("node JSON");
            copy["metadata"]["name"] = json!(if i == 0 {
                "ok".to_string()
            } else {
                format!("n{i}")
            });
            copy["metadata"]["labels"] = json!({"padding": padding});
            copy
        })
        .collect();
    let body = json!({"Pod": pod, "Nodes": {"items": items}}).to_string();
    assert!(body.len() > 3_000_000, "{}", body.len());
    let (status, text) =
        common::http(&extender.address, "POST", "/filter", &body).expect("answered");
    assert_eq!(status, 200, "{}", &text[..text.len().min(300)]);
    let reply: Value = serde_json::from_str(&text).expect("JSON");
    // Every copy carries ok's inventory: all 400 pass, judged from the objects.
    assert_eq!(reply["Nodes"]["items"].as_array().map(Vec::len), Some(400));
    // A body over 64 MiB is refused, in one line of JSON. The reply is read
    // while the body is still being written (the server stops reading).
    let stream = std::net::TcpStream::connect(&extender.address).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut writer = stream.try_clone().expect("clone");
    let size = 65 * 1024 * 1024;
    let sender = std::thread::spawn(move || {
        use std::io::Write;
        let head = format!(
            "POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {size}\r\nConnection: close\r\n\r\n"
        );
        let chunk = vec![b' '; 1024 * 1024];
        let _ = writer.write_all(head.as_bytes());
        for _ in 0..65 {
            if writer.write_all(&chunk).is_err() {
                break;
            }
        }
    });
    let mut reply = Vec::new();
    let mut reader = stream;
    let mut buffer = [0u8; 4096];
    // Read until the end of the reply's body (one JSON line) or the close.
    loop {
        match std::io::Read::read(&mut reader, &mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => reply.extend_from_slice(&buffer[..n]),
        }
        if String::from_utf8_lossy(&reply).contains("}") {
            break;
        }
    }
    drop(reader);
    let _ = sender.join();
    let reply = String::from_utf8_lossy(&reply);
    let (head, body) = reply.split_once("\r\n\r\n").expect("a reply");
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    assert_eq!(body.trim().lines().count(), 1, "{body}");
    let error: Value = serde_json::from_str(body.trim()).expect("JSON error");
    assert!(!error_of(&error).is_empty(), "{body}");
}
