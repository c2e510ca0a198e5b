//! Bind against the stand-in API server: annotations then Binding, the
//! per-node lock, roll-back on failure, two replicas on one node, and a
//! restart that rebuilds the state from the API alone.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{
    ExtenderProcess, annotation, bind_lease, binding_args, device_plugin_stand_in, error_of,
    eventually, get_pod, gpu_pod, holder, inventory, lease_holder, node_of, put_node, put_pod,
    put_share_node, set_fault, share_allocation,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use serde_json::{Value, json};
use tessera_model::sched::allocation::{Allocation, DeviceAllocation};

/// The pod's `tessera.io/allocation`, which must be there and parse.
fn allocation_of(pod: &Pod) -> Allocation {
    Allocation::parse(annotation(pod, "tessera.io/allocation").expect("allocation"))
        .expect("parses")
}

/// Asserts the pod is in `bind-phase: allocating` with a `bind-time` (RFC
/// 3339) no earlier than `before` (to the second).
fn assert_allocating_since(pod: &Pod, before: Timestamp) {
    assert_eq!(annotation(pod, "tessera.io/bind-phase"), Some("allocating"));
    let time: Timestamp = annotation(pod, "tessera.io/bind-time")
        .expect("bind-time")
        .parse()
        .expect("RFC 3339");
    assert!(
        time.as_second() >= before.as_second() - 1,
        "{time} vs {before}"
    );
}

/// Posts each `(address, node)` bind of `pod`… at once, each from its own
/// thread (all released together when `together`); the replies in order, with
/// the node each asked for.
fn bind_concurrently(calls: &[(&str, &str, &Pod)], together: bool) -> Vec<(String, Value)> {
    let barrier = std::sync::Barrier::new(if together { calls.len() } else { 1 });
    std::thread::scope(|scope| {
        let handles: Vec<_> = calls
            .iter()
            .map(|&(address, node, pod)| {
                let body = binding_args(pod, node).to_string();
                let barrier = &barrier;
                scope.spawn(move || {
                    barrier.wait();
                    let (status, text) =
                        common::http(address, "POST", "/bind", &body).expect("bind answered");
                    assert_eq!(status, 200, "{text}");
                    (
                        node.to_string(),
                        serde_json::from_str::<Value>(&text).expect("JSON"),
                    )
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    })
}

/// Creates pods `p0`, `p1` … each asking one GPU of `mib`.
async fn put_numbered_pods(client: &kube::Client, count: usize, mib: u64) -> Vec<Pod> {
    let mut pods = Vec::new();
    for i in 0..count {
        pods.push(put_pod(client, &gpu_pod(&format!("p{i}"), 1, mib, None, &[])).await);
    }
    pods
}

/// Each pod with its index and the replica that binds it, taking the
/// replicas in turn.
fn alternating<'a>(
    replicas: &[&'a ExtenderProcess],
    pods: &'a [Pod],
) -> impl Iterator<Item = (&'a str, usize, &'a Pod)> {
    pods.iter()
        .enumerate()
        .map(|(i, pod)| (replicas[i % replicas.len()].address.as_str(), i, pod))
}

/// MiB held in all on `node` by the pods' allocations.
async fn total_held(client: &kube::Client, node: &str) -> u64 {
    memory_held(client, node).await.values().sum()
}

/// MiB held per GPU uuid by the pods' allocations on `node`.
async fn memory_held(client: &kube::Client, node: &str) -> BTreeMap<String, u64> {
    let pods = Api::<Pod>::all(client.clone())
        .list(&Default::default())
        .await
        .expect("pods");
    let mut held = BTreeMap::new();
    for pod in pods.items {
        let Some(text) = annotation(&pod, "tessera.io/allocation") else {
            continue;
        };
        let allocation = Allocation::parse(text).expect("the extender writes readable allocations");
        if allocation.node != node {
            continue;
        }
        for (_, device) in allocation.devices() {
            if let DeviceAllocation::Share {
                uuid, memory_mib, ..
            } = device
            {
                *held.entry(uuid.clone()).or_default() += memory_mib;
            }
        }
    }
    held
}

#[tokio::test(flavor = "multi_thread")]
async fn bind_writes_the_reservation_then_the_binding_and_holds_the_lock() {
    let Some((server, client)) = common::api().await else {
        return;
    };
    put_share_node(&client, "gpu-1", 1).await;
    let extender = ExtenderProcess::start(server.kubeconfig(), &[]).expect("extender");
    let pod = put_pod(&client, &gpu_pod("train", 1, 8000, Some(30), &[])).await;
    let before = Timestamp::now();
    let reply = extender.bind(&pod, "gpu-1");
    assert_eq!(reply, json!({"Error": ""}), "{}", extender.log_text());

    let bound = get_pod(&client, "train").await;
    assert_eq!(node_of(&bound).as_deref(), Some("gpu-1"));
    assert_allocating_since(&bound, before);
    let allocation = allocation_of(&bound);
    assert_eq!(allocation.node, "gpu-1");
    assert_eq!(allocation.containers.len(), 1);
    assert_eq!(allocation.containers[0].name, "main");
    assert_eq!(
        allocation.containers[0].devices,
        vec![DeviceAllocation::Share {
            uuid: "GPU-A100-40GB-0-0000".into(),
            memory_mib: 8000,
            cores: 30
        }]
    );
    // The lock stays held for the device plugin.
    assert_eq!(lease_holder(&client, "gpu-1").await, Some(holder(&pod)));
    // When the device plugin is done, the extender's sweep releases it.
    let patch = json!({"metadata": {"annotations": {"tessera.io/bind-phase": "success"}}});
    Api::<Pod>::namespaced(client.clone(), "default")
        .patch(
            "train",
            &Default::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .expect("patch");
    eventually(
        "the sweep releases the finished bind's lock",
        Duration::from_secs(15),
        || async { lease_holder(&client, "gpu-1").await.is_none() },
    )
    .await;
    let metrics = extender.metrics();
    assert!(
        metrics.contains("tessera_extender_bind_total{result=\"success\"} 1"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bind_for_a_deleted_pod_fails_and_leaves_nothing_behind() {
    let Some((server, client)) = common::api().await else {
        return;
    };
    put_share_node(&client, "gpu-1", 1).await;
    let extender = ExtenderProcess::start(server.kubeconfig(), &[]).expect("extender");
    let pod = put_pod(&client, &gpu_pod("gone", 1, 8000, None, &[])).await;
    Api::<Pod>::namespaced(client.clone(), "default")
        .delete("gone", &Default::default())
        .await
        .expect("deleted");
    let reply = extender.bind(&pod, "gpu-1");
    let error = error_of(&reply);
    assert!(
        error.contains("default/gone") && error.contains("gone"),
        "{reply}"
    );
    assert_eq!(lease_holder(&client, "gpu-1").await, None);
    // Another pod binds at once: nothing was left held.
    let next = put_pod(&client, &gpu_pod("next", 1, 8000, None, &[])).await;
    let reply = extender.bind(&next, "gpu-1");
    assert_eq!(reply["Error"], "", "{reply}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bind_that_no_longer_fits_rolls_back_and_releases_the_lock() {
    let Some((server, client)) = common::api().await else {
        return;
    };
    put_share_node(&client, "gpu-1", 1).await;
    let extender =
        ExtenderProcess::start(server.kubeconfig(), &["--lock-wait", "5"]).expect("extender");
    let plugin = device_plugin_stand_in(client.clone());
    // 2 × 30000 MiB on a 40960 MiB GPU: each fits alone, not both.
    let first = put_pod(&client, &gpu_pod("first", 1, 30000, None, &[])).await;
    let second = put_pod(&client, &gpu_pod("second", 1, 30000, None, &[])).await;
    for pod in [&first, &second] {
        let reply = extender.filter(pod, &["gpu-1"]);
        assert_eq!(
            reply["NodeNames"],
            json!(["gpu-1"]),
            "both fit before either binds: {reply}"
        );
    }
    let reply = extender.bind(&first, "gpu-1");
    assert_eq!(reply["Error"], "", "{reply}");
    let reply = extender.bind(&second, "gpu-1");
    let error = error_of(&reply).to_string();
    assert!(
        error.contains("no longer fits"),
        "{reply}\n{}",
        extender.log_text()
    );
    let second_now = get_pod(&client, "second").await;
    assert_eq!(annotation(&second_now, "tessera.io/allocation"), None);
    assert_eq!(annotation(&second_now, "tessera.io/bind-phase"), None);
    assert_eq!(node_of(&second_now), None);
    assert_ne!(lease_holder(&client, "gpu-1").await, Some(holder(&second)));
    // The filter now tells why.
    let reply = extender.filter(&second, &["gpu-1"]);
    assert_eq!(reply["NodeNames"], json!([]), "{reply}");
    assert!(
        !reply["FailedNodes"]["gpu-1"]
            .as_str()
            .unwrap_or("")
            .is_empty(),
        "{reply}"
    );
    plugin.abort();
    assert_eq!(total_held(&client, "gpu-1").await, 30000);
}

#[tokio::test(flavor = "multi_thread")]
async fn two_replicas_binding_to_one_node_never_over_commit() {
    let Some((server, client)) = common::api().await else {
        return;
    };
    put_share_node(&client, "gpu-1", 2).await;
    let a = ExtenderProcess::start(server.kubeconfig(), &["--identity", "a"]).expect("replica a");
    let b = ExtenderProcess::start(server.kubeconfig(), &["--identity", "b"]).expect("replica b");
    let plugin = device_plugin_stand_in(client.clone());
    // 16 pods of 10000 MiB; two GPUs of 40960 MiB hold 4 each: 8 fit.
    let pods = put_numbered_pods(&client, 16, 10000).await;
    let calls: Vec<_> = alternating(&[&a, &b], &pods)
        .map(|(address, _, pod)| (address, "gpu-1", pod))
        .collect();
    let replies: Vec<Value> = bind_concurrently(&calls, false)
        .into_iter()
        .map(|(_, reply)| reply)
        .collect();
    let bound = replies.iter().filter(|r| r["Error"] == "").count();
    // Every bind that failed failed for want of room (the lock-wait is long
    // enough that none gave up on the lock), never for a broken protocol.
    for reply in replies.iter().filter(|r| r["Error"] != "") {
        assert!(error_of(reply).contains("no longer fits"), "{reply}");
    }
    let held = memory_held(&client, "gpu-1").await;
    for (uuid, mib) in &held {
        assert!(
            *mib <= 40960,
            "{uuid} over-committed: {mib} MiB\n{held:?}\n{replies:?}"
        );
    }
    assert_eq!(held.values().sum::<u64>(), 10000 * bound as u64, "{held:?}");
    assert!(bound <= 8, "{bound} bound");
    // Every pod is either bound with an allocation or unbound without one.
    for pod in &pods {
        let now = get_pod(&client, pod.metadata.name.as_deref().unwrap_or("")).await;
        let on_node = now.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("gpu-1");
        assert_eq!(
            on_node,
            annotation(&now, "tessera.io/allocation").is_some(),
            "{:?}",
            now.metadata
        );
    }
    // Binds wait on the lock rather than failing it; the lock-wait is long enough for all 16.
    assert_eq!(
        bound,
        8,
        "{replies:?}\nA:\n{}\nB:\n{}",
        a.log_text(),
        b.log_text()
    );
    plugin.abort();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_extender_rebuilds_its_state_from_the_api() {
    let Some((server, client)) = common::api().await else {
        return;
    };
    put_share_node(&client, "gpu-1", 1).await;
    let plugin = device_plugin_stand_in(client.clone());
    let mut first = ExtenderProcess::start(server.kubeconfig(), &[]).expect("extender");
    for name in ["a", "b"] {
        let pod = put_pod(&client, &gpu_pod(name, 1, 16000, None, &[])).await;
        let reply = first.bind(&pod, "gpu-1");
        assert_eq!(reply["Error"], "", "{reply}");
    }
    first.stop();
    let second = ExtenderProcess::start(server.kubeconfig(), &[]).expect("restarted");
    // 40960 − 2 × 16000 = 8960 MiB left.
    let big = put_pod(&client, &gpu_pod("big", 1, 16000, None, &[])).await;
    let small = put_pod(&client, &gpu_pod("small", 1, 8000, None, &[])).await;
    let reply = second.filter(&big, &["gpu-1"]);
    assert_eq!(reply["NodeNames"], json!([]), "{reply}");
    let reply = second.filter(&small, &["gpu-1"]);
    assert_eq!(reply["NodeNames"], json!(["gpu-1"]), "{reply}");
    let metrics = second.metrics();
    let line = format!(
        "GPUDeviceMemoryAllocated{{nodeid=\"gpu-1\",deviceuuid=\"GPU-A100-40GB-0-0000\",deviceidx=\"0\",devicecores=\"0\",zone=\"vGPU\"}} {}",
        32000.0 * 1024.0 * 1024.0
    );
    assert!(metrics.contains(&line), "{line}\n{metrics}");
    let (status, report) = common::http(&second.address, "GET", "/inspect", "").expect("inspect");
    assert_eq!(status, 200);
    let report: Value = serde_json::from_str(&report).expect("JSON");
    assert_eq!(
        report["nodes"][0]["gpus"][0]["memoryMiB"]["allocated"], 32000,
        "{report}"
    );
    plugin.abort();
}

#[tokio::test(flavor = "multi_thread")]
async fn realized_mig_instances_are_exported_under_hamis_metric() {
    let Some((server, client)) = common::api().await else {
        return;
    };
    put_node(
        &client,
        "mig-1",
        Some(&inventory(vec![common::mig_gpu("A100-40GB", 0)])),
    )
    .await;
    let mut pod = gpu_pod("mig", 1, 4000, None, &[("nvidia.com/vgpu-mode", "mig")]);
    let annotations = pod.metadata.annotations.get_or_insert_default();
    annotations.insert(
        "tessera.io/allocation".into(),
        json!({"version": 1, "node": "mig-1", "containers": [{"index": 0, "name": "main", "devices": [
            {"mode": "mig", "uuid": "GPU-A100-40GB-0-0001", "profile": "1g.5gb", "profileId": 19,
             "placement": {"start": 6, "size": 1}, "memoryMiB": 4864,
             "realized": {"migUuid": "MIG-abc", "gpuInstanceId": 13, "computeInstanceId": 0}}]}]})
        .to_string(),
    );
    if let Some(spec) = pod.spec.as_mut() {
        spec.node_name = Some("mig-1".into());
    }
    put_pod(&client, &pod).await;
    let extender = ExtenderProcess::start(server.kubeconfig(), &[]).expect("extender");
    let metrics = extender.metrics();
    let line = "hami_node_gpu_mig_instance_info{node=\"mig-1\",device_uuid=\"GPU-A100-40GB-0-0001\",device_index=\"0\",mig_uuid=\"MIG-abc\",profile=\"1g.5gb\",gpu_instance_id=\"13\",compute_instance_id=\"0\",placement_start=\"6\",placement_size=\"1\"} 1";
    assert!(metrics.contains(line), "{metrics}");
    for name in [
        "GPUDeviceMemoryLimit",
        "GPUDeviceCoreLimit",
        "GPUDeviceCoreAllocated",
        "GPUDeviceSharedNum",
    ] {
        assert!(
            metrics.contains(&format!("{name}{{nodeid=\"mig-1\"")),
            "{name}\n{metrics}"
        );
    }
    assert!(metrics.contains("GPUDeviceSharedNum{nodeid=\"mig-1\",deviceuuid=\"GPU-A100-40GB-0-0001\",deviceidx=\"0\",zone=\"vGPU\"} 1"), "{metrics}");
    // A 1g.5gb holds 1 of the A100-40GB's 7 compute slices (reference/mig.md): 100/7 %.
    let prefix = "GPUDeviceCoreAllocated{nodeid=\"mig-1\",deviceuuid=\"GPU-A100-40GB-0-0001\",deviceidx=\"0\",zone=\"vGPU\"} ";
    let value: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix(prefix))
        .unwrap_or_else(|| panic!("{prefix}\n{metrics}"))
        .parse()
        .expect("a number");
    assert!((value - 100.0 / 7.0).abs() < 1e-6, "{value}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_binding_removes_the_annotations_and_releases_the_lock() {
    let Some((server, client)) = common::api().await else {
        return;
    };
    put_share_node(&client, "gpu-1", 1).await;
    let proxy = common::FaultyApi::start(&server).await;
    let extender = ExtenderProcess::start(&proxy.kubeconfig, &[]).expect("extender");
    let pod = put_pod(&client, &gpu_pod("unlucky", 1, 30000, None, &[])).await;
    set_fault(&proxy.fail_bindings, true);
    let reply = extender.bind(&pod, "gpu-1");
    let error = error_of(&reply).to_string();
    assert!(error.contains("injected failure"), "{reply}");
    let now = get_pod(&client, "unlucky").await;
    for key in [
        "tessera.io/allocation",
        "tessera.io/bind-phase",
        "tessera.io/bind-time",
    ] {
        assert_eq!(annotation(&now, key), None, "{key} left behind");
    }
    assert_eq!(node_of(&now), None);
    assert_eq!(lease_holder(&client, "gpu-1").await, None);
    // Nothing stays reserved: the same 30000 MiB binds once the API works again.
    set_fault(&proxy.fail_bindings, false);
    let reply = extender.filter(&pod, &["gpu-1"]);
    assert_eq!(reply["NodeNames"], json!(["gpu-1"]), "{reply}");
    let reply = extender.bind(&pod, "gpu-1");
    assert_eq!(reply["Error"], "", "{reply}");
    let metrics = extender.metrics();
    assert!(
        metrics.contains("tessera_extender_bind_total{result=\"failure\"} 1"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn hamis_dynamic_mig_example_reserves_two_legal_disjoint_instances() {
    let Some((server, client)) = common::api().await else {
        return;
    };
    put_node(
        &client,
        "mig-1",
        Some(&inventory(vec![
            common::mig_gpu("A100-40GB", 0),
            common::mig_gpu("A100-40GB", 1),
        ])),
    )
    .await;
    let extender = ExtenderProcess::start(server.kubeconfig(), &[]).expect("extender");
    let plugin = device_plugin_stand_in(client.clone());
    // gpu: 2, gpumem: 8000, vgpu-mode: mig. On A100-40GB (reference/mig.md) the
    // smallest profile with ≥ 8000 MiB is 1g.10gb (id 15, ≈ 9.62 GiB, 1 compute
    // slice; 2g.10gb has as much memory but 2 slices), 2 memory slices at {0,2,4,6}.
    let mut taken: BTreeMap<String, Vec<(u32, u32)>> = BTreeMap::new();
    for name in ["mig-a", "mig-b"] {
        let pod = put_pod(
            &client,
            &gpu_pod(name, 2, 8000, None, &[("nvidia.com/vgpu-mode", "mig")]),
        )
        .await;
        let reply = extender.bind(&pod, "mig-1");
        assert_eq!(reply["Error"], "", "{reply}");
        let bound = get_pod(&client, name).await;
        let allocation = allocation_of(&bound);
        let devices = &allocation.containers[0].devices;
        assert_eq!(devices.len(), 2, "{allocation:?}");
        let mut uuids = Vec::new();
        for device in devices {
            let DeviceAllocation::Mig {
                uuid,
                profile,
                profile_id,
                placement,
                realized,
                ..
            } = device
            else {
                panic!("a MIG device expected: {device:?}");
            };
            assert_eq!((profile.as_str(), *profile_id), ("1g.10gb", 15));
            assert_eq!(placement.size, 2);
            assert!([0, 2, 4, 6].contains(&placement.start), "{placement:?}");
            assert_eq!(*realized, None);
            uuids.push(uuid.clone());
            taken
                .entry(uuid.clone())
                .or_default()
                .push((placement.start, placement.size));
        }
        uuids.sort();
        uuids.dedup();
        assert_eq!(uuids.len(), 2, "two devices on two GPUs: {allocation:?}");
    }
    for (uuid, placements) in &taken {
        let mut slots = std::collections::BTreeSet::new();
        for (start, size) in placements {
            for slot in *start..start + size {
                assert!(
                    slots.insert(slot),
                    "{uuid}: overlapping placements {placements:?}"
                );
            }
        }
    }
    plugin.abort();
}

#[tokio::test(flavor = "multi_thread")]
async fn many_concurrent_binds_across_nodes_and_replicas_never_over_commit() {
    let Some((server, client)) = common::api().await else {
        return;
    };
    let nodes = ["n-1", "n-2", "n-3", "n-4"];
    for node in nodes {
        put_share_node(&client, node, 2).await;
    }
    let a = ExtenderProcess::start(server.kubeconfig(), &["--lock-wait", "20"]).expect("replica a");
    let b = ExtenderProcess::start(server.kubeconfig(), &["--lock-wait", "20"]).expect("replica b");
    let plugin = device_plugin_stand_in(client.clone());
    // 80 pods of 6000 MiB: a 40960 MiB GPU holds 6, the 8 GPUs 48.
    let pods = put_numbered_pods(&client, 80, 6000).await;
    let calls: Vec<_> = alternating(&[&a, &b], &pods)
        .map(|(address, i, pod)| (address, nodes[(i * 7 + i / 3) % nodes.len()], pod))
        .collect();
    let replies = bind_concurrently(&calls, false);
    let mut bound = 0;
    for node in nodes {
        let held = memory_held(&client, node).await;
        for (uuid, mib) in &held {
            assert!(*mib <= 40960, "{node} {uuid} over-committed: {mib} MiB");
            assert_eq!(mib % 6000, 0);
        }
        bound += held.values().sum::<u64>() / 6000;
    }
    let succeeded = replies.iter().filter(|(_, r)| r["Error"] == "").count() as u64;
    assert_eq!(
        bound, succeeded,
        "every success left exactly one reservation"
    );
    assert!(bound <= 48);
    for (pod, (node, reply)) in pods.iter().zip(&replies) {
        let now = get_pod(&client, pod.metadata.name.as_deref().unwrap_or("")).await;
        let on = node_of(&now);
        if reply["Error"] == "" {
            assert_eq!(on.as_deref(), Some(node.as_str()));
            assert!(annotation(&now, "tessera.io/allocation").is_some());
        } else {
            assert_eq!(on, None, "{reply}");
            assert_eq!(annotation(&now, "tessera.io/allocation"), None, "{reply}");
        }
    }
    // Each node got 20 asks for 12 places: with waits long enough, all 12 bind.
    assert_eq!(bound, 48, "{replies:?}");
    plugin.abort();
}

fn patch_annotations(value: Value) -> kube::api::Patch<Value> {
    kube::api::Patch::Merge(json!({"metadata": {"annotations": value}}))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lock_stamped_29_s_ago_with_its_bind_still_running_is_not_taken_over() {
    let Some((server, client)) = common::api().await else {
        return;
    };
    put_share_node(&client, "gpu-1", 1).await;
    let extender =
        ExtenderProcess::start(server.kubeconfig(), &["--lock-wait", "3"]).expect("extender");
    // Replica A took gpu-1's lock for `first` 29 s ago by its clock (slow
    // reads, or a clock 29 s behind) and has not written its annotations.
    let first = put_pod(&client, &gpu_pod("first", 1, 30000, None, &[])).await;
    let stamp = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(29),
    );
    let lease = bind_lease("gpu-1", &holder(&first), 300, stamp);
    Api::<Lease>::namespaced(client.clone(), "kube-system")
        .create(&Default::default(), &lease)
        .await
        .expect("lease");
    let second = put_pod(&client, &gpu_pod("second", 1, 30000, None, &[])).await;
    // 29 s + the 3 s wait is past the 30 s grace by A's stamp; by this
    // replica's own sight of the lease it is 3 s old: still held.
    let reply = extender.bind(&second, "gpu-1");
    let error = error_of(&reply).to_string();
    assert!(
        error.contains("bind lock held by") && error.contains(&holder(&first)),
        "{reply}"
    );
    // A's annotations land now: its bind is visibly in progress.
    Api::<Pod>::namespaced(client.clone(), "default")
        .patch(
            "first",
            &Default::default(),
            &patch_annotations(json!({
                "tessera.io/allocation": share_allocation("gpu-1", 30000),
                "tessera.io/bind-phase": "allocating",
                "tessera.io/bind-time": Timestamp::now().to_string(),
            })),
        )
        .await
        .expect("A's annotations");
    let reply = extender.bind(&second, "gpu-1");
    assert!(error_of(&reply).contains("bind lock held by"), "{reply}");
    let now = get_pod(&client, "second").await;
    assert_eq!(annotation(&now, "tessera.io/allocation"), None);
    assert_eq!(node_of(&now), None);
    assert_eq!(lease_holder(&client, "gpu-1").await, Some(holder(&first)));
    assert_eq!(total_held(&client, "gpu-1").await, 30000);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_carrying_a_stale_bind_phase_success_neither_frees_the_lock_nor_holds_gpus() {
    let Some((server, client)) = common::api().await else {
        return;
    };
    put_share_node(&client, "gpu-1", 1).await;
    // Re-created from `kubectl get -o yaml`: the system annotations of a
    // bind long ago, not bound.
    let old_time = "2026-01-01T00:00:00Z";
    let copied = put_pod(
        &client,
        &gpu_pod(
            "copied",
            1,
            30000,
            None,
            &[
                ("tessera.io/allocation", &share_allocation("gpu-1", 30000)),
                ("tessera.io/bind-phase", "success"),
                ("tessera.io/bind-time", old_time),
            ],
        ),
    )
    .await;
    let other = put_pod(&client, &gpu_pod("other", 1, 30000, None, &[])).await;
    let extender =
        ExtenderProcess::start(server.kubeconfig(), &["--lock-wait", "2"]).expect("extender");
    // The stale allocation holds nothing: 30000 MiB still fit.
    let reply = extender.filter(&other, &["gpu-1"]);
    assert_eq!(reply["NodeNames"], json!(["gpu-1"]), "{reply}");
    // Replica A is binding `copied` to gpu-1 (took the lock, not written yet).
    let replica_a = tessera_extender::lock::BindLocks::new(
        client.clone(),
        "kube-system",
        Duration::from_secs(1),
    );
    let held = replica_a
        .acquire("gpu-1", &holder(&copied))
        .await
        .expect("A takes the lock");
    // The stale `success` does not free A's lock for this replica.
    let reply = extender.bind(&other, "gpu-1");
    let error = error_of(&reply);
    assert!(
        error.contains("bind lock held by") && error.contains(&holder(&copied)),
        "{reply}"
    );
    assert_eq!(
        get_pod(&client, "other")
            .await
            .spec
            .and_then(|s| s.node_name),
        None
    );
    // A gives up; this replica binds `copied`, overwriting the stale annotations.
    replica_a.release(&held).await.expect("released");
    let before = Timestamp::now();
    let reply = extender.bind(&copied, "gpu-1");
    assert_eq!(reply["Error"], "", "{reply}");
    let now = get_pod(&client, "copied").await;
    assert_allocating_since(&now, before);
    // Now it holds its 30000 MiB: the other no longer fits.
    let plugin = device_plugin_stand_in(client.clone());
    let reply = extender.bind(&other, "gpu-1");
    assert!(error_of(&reply).contains("no longer fits"), "{reply}");
    plugin.abort();
    assert_eq!(total_held(&client, "gpu-1").await, 30000);
}

#[tokio::test(flavor = "multi_thread")]
async fn simultaneous_binds_of_one_pod_bind_it_once_with_its_allocation() {
    let Some((server, client)) = common::api().await else {
        return;
    };
    for node in ["gpu-1", "gpu-2"] {
        put_share_node(&client, node, 1).await;
    }
    let a = ExtenderProcess::start(server.kubeconfig(), &["--lock-wait", "3"]).expect("replica a");
    let b = ExtenderProcess::start(server.kubeconfig(), &["--lock-wait", "3"]).expect("replica b");
    let plugin = device_plugin_stand_in(client.clone());
    // Per round: (replica, node) of the two calls, sent at once.
    let rounds: [[(&str, &str); 2]; 6] = [
        [(&a.address, "gpu-1"), (&b.address, "gpu-2")],
        [(&a.address, "gpu-2"), (&a.address, "gpu-1")],
        [(&b.address, "gpu-1"), (&a.address, "gpu-1")],
        [(&a.address, "gpu-1"), (&a.address, "gpu-1")],
        [(&b.address, "gpu-2"), (&a.address, "gpu-1")],
        [(&b.address, "gpu-1"), (&b.address, "gpu-2")],
    ];
    for (round, calls) in rounds.iter().enumerate() {
        let pod = put_pod(&client, &gpu_pod(&format!("p{round}"), 1, 4000, None, &[])).await;
        let calls: Vec<_> = calls
            .iter()
            .map(|&(address, node)| (address, node, &pod))
            .collect();
        let replies = bind_concurrently(&calls, true);
        let won: Vec<&String> = replies
            .iter()
            .filter(|(_, r)| r["Error"] == "")
            .map(|(node, _)| node)
            .collect();
        assert_eq!(
            won.len(),
            1,
            "round {round}: exactly one bind wins: {replies:?}"
        );
        let now = get_pod(&client, &format!("p{round}")).await;
        let on = node_of(&now);
        assert_eq!(on.as_deref(), Some(won[0].as_str()), "round {round}");
        let allocation = allocation_of(&now);
        assert_eq!(&allocation.node, won[0], "round {round}: {replies:?}");
        // The loser left no lock held under this pod on its node.
        for (node, reply) in &replies {
            if node != won[0] {
                assert_ne!(
                    lease_holder(&client, node).await,
                    Some(holder(&pod)),
                    "round {round}: {reply}"
                );
            }
        }
    }
    plugin.abort();
    let total: u64 = total_held(&client, "gpu-1").await + total_held(&client, "gpu-2").await;
    assert_eq!(total, 6 * 4000, "one allocation per pod");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_binding_whose_confirming_read_fails_keeps_the_reservation_until_known() {
    let Some((server, client)) = common::api().await else {
        return;
    };
    put_share_node(&client, "gpu-1", 1).await;
    let proxy = common::FaultyApi::start(&server).await;
    let extender = ExtenderProcess::start(&proxy.kubeconfig, &[]).expect("extender");
    let pod = put_pod(&client, &gpu_pod("unlucky", 1, 30000, None, &[])).await;
    let other = put_pod(&client, &gpu_pod("other", 1, 30000, None, &[])).await;
    set_fault(&proxy.fail_bindings, true);
    set_fault(&proxy.blind_after_binding, true);
    let reply = extender.bind(&pod, "gpu-1");
    let error = error_of(&reply).to_string();
    assert!(
        error.contains("injected failure") && error.contains("unknown"),
        "{reply}"
    );
    // Nothing undone: the annotations, the lock and the reservation stay.
    let now = get_pod(&client, "unlucky").await;
    assert_eq!(node_of(&now), None);
    assert_eq!(
        annotation(&now, "tessera.io/bind-phase"),
        Some("allocating")
    );
    assert!(annotation(&now, "tessera.io/allocation").is_some());
    assert_eq!(lease_holder(&client, "gpu-1").await, Some(holder(&pod)));
    let reply = extender.filter(&other, &["gpu-1"]);
    assert_eq!(reply["NodeNames"], json!([]), "{reply}");
    // The API works again: the extender finds the pod unbound, rolls back
    // and releases the lock by itself.
    set_fault(&proxy.fail_bindings, false);
    set_fault(&proxy.blind_after_binding, false);
    set_fault(&proxy.pod_reads_fail, false);
    eventually(
        "the bind of unknown outcome is found unmade and undone",
        Duration::from_secs(40),
        || async {
            let now = get_pod(&client, "unlucky").await;
            annotation(&now, "tessera.io/allocation").is_none()
                && lease_holder(&client, "gpu-1").await.is_none()
        },
    )
    .await;
    let reply = extender.bind(&pod, "gpu-1");
    assert_eq!(reply["Error"], "", "{reply}\n{}", extender.log_text());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_binding_made_with_its_reply_lost_and_no_read_back_keeps_the_allocation() {
    let Some((server, client)) = common::api().await else {
        return;
    };
    put_share_node(&client, "gpu-1", 1).await;
    let proxy = common::FaultyApi::start(&server).await;
    let extender = ExtenderProcess::start(&proxy.kubeconfig, &[]).expect("extender");
    let pod = put_pod(&client, &gpu_pod("lucky", 1, 30000, None, &[])).await;
    set_fault(&proxy.lose_binding_replies, true);
    set_fault(&proxy.blind_after_binding, true);
    let reply = extender.bind(&pod, "gpu-1");
    assert!(error_of(&reply).contains("unknown"), "{reply}");
    set_fault(&proxy.lose_binding_replies, false);
    set_fault(&proxy.blind_after_binding, false);
    set_fault(&proxy.pod_reads_fail, false);
    // Past the re-check: the pod is on the node and keeps its allocation;
    // the lock stays for the device plugin.
    tokio::time::sleep(tessera_extender::verbs::UNKNOWN_RECHECK + Duration::from_secs(3)).await;
    let now = get_pod(&client, "lucky").await;
    assert_eq!(
        now.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some("gpu-1")
    );
    assert_eq!(
        annotation(&now, "tessera.io/bind-phase"),
        Some("allocating")
    );
    let allocation = allocation_of(&now);
    assert_eq!(allocation.node, "gpu-1");
    assert_eq!(lease_holder(&client, "gpu-1").await, Some(holder(&pod)));
}
