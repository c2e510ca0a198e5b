//! The extender behind the stand-in kube-scheduler (`tessera-sim scheduler`)
//! with an extender configuration like the shipped one: nodeCacheCapable,
//! filter + prioritize + bind, memory and cores ignored by the scheduler.
//! The gpushare demos: three pods binpacked onto one GPU; a pod that fits a
//! node's total but no single GPU stays Pending with the reason in its Event.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    ExtenderProcess, annotation, device_plugin_stand_in, gpu_pod, inventory, put_node, put_pod,
    share_gpu,
};
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use tessera_model::sched::allocation::Allocation;

async fn make_ready(client: &kube::Client, name: &str) {
    let resources = json!({"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "20"});
    let status = json!({"status": {
        "capacity": resources, "allocatable": resources,
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test node"}],
    }});
    Api::<Node>::all(client.clone())
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("node status");
}

async fn node_of(client: &kube::Client, pod: &str) -> Option<String> {
    common::get_pod(client, pod)
        .await
        .spec
        .and_then(|s| s.node_name)
}

#[tokio::test(flavor = "multi_thread")]
async fn gpushare_demos_behind_the_stand_in_scheduler() {
    let Some((server, client)) = common::api().await else {
        return;
    };
    // One A100-40GB per node for the binpack demo; a third node with two for
    // the "fits the node's total but no single GPU" demo.
    for (node, gpus) in [
        ("gpu-1", vec![share_gpu("A100-40GB", 0)]),
        ("gpu-2", vec![share_gpu("A100-40GB", 0)]),
        (
            "gpu-3",
            vec![share_gpu("A100-40GB", 0), share_gpu("A100-40GB", 1)],
        ),
    ] {
        put_node(&client, node, Some(&inventory(gpus))).await;
        make_ready(&client, node).await;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let extender = ExtenderProcess::start(server.kubeconfig(), &[]).expect("extender");
    let plugin = device_plugin_stand_in(client.clone());
    let config = json!({
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "extenders": [{
            "urlPrefix": format!("http://{}", extender.address),
            "filterVerb": "filter", "prioritizeVerb": "prioritize", "bindVerb": "bind",
            "weight": 1, "nodeCacheCapable": true, "httpTimeout": "30s",
            "managedResources": [
                {"name": "nvidia.com/gpu", "ignoredByScheduler": false},
                {"name": "nvidia.com/gpumem", "ignoredByScheduler": true},
                {"name": "nvidia.com/gpumem-percentage", "ignoredByScheduler": true},
                {"name": "nvidia.com/gpucores", "ignoredByScheduler": true},
            ],
        }],
    });
    let config_path = dir.path().join("scheduler.yaml");
    std::fs::write(&config_path, config.to_string()).expect("write config");
    let scheduler_log = dir.path().join("scheduler.log");
    let scheduler = Command::new(tessera_test_support::artefact("tessera-sim"))
        .arg("scheduler")
        .arg("--config")
        .arg(&config_path)
        .arg("--kubeconfig")
        .arg(server.kubeconfig())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&scheduler_log).expect("log"))
        .spawn()
        .expect("scheduler starts");
    let logs = || {
        format!(
            "scheduler:\n{}\nextender:\n{}",
            std::fs::read_to_string(&scheduler_log).unwrap_or_default(),
            extender.log_text()
        )
    };

    // Binpack: three 10000 MiB pods, one after the other, share one GPU.
    let mut placed = Vec::new();
    for name in ["share-1", "share-2", "share-3"] {
        let binpack = [
            ("tessera.io/gpu-policy", "binpack"),
            ("tessera.io/node-policy", "binpack"),
        ];
        put_pod(&client, &gpu_pod(name, 1, 10000, None, &binpack)).await;
        let deadline = Instant::now() + Duration::from_secs(30);
        let node = loop {
            if let Some(node) = node_of(&client, name).await {
                break node;
            }
            assert!(Instant::now() < deadline, "{name} not bound\n{}", logs());
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let pod: Pod = common::get_pod(&client, name).await;
        let allocation =
            Allocation::parse(annotation(&pod, "tessera.io/allocation").expect("allocation"))
                .expect("parses");
        assert_eq!(allocation.node, node);
        placed.push((node, allocation.containers[0].devices[0].uuid().to_string()));
    }
    assert!(
        placed.windows(2).all(|w| w[0] == w[1]),
        "binpacked onto one GPU: {placed:?}\n{}",
        logs()
    );

    // 50000 MiB: gpu-3 has 2 × 40960 MiB, no GPU has 50000.
    put_pod(&client, &gpu_pod("too-big", 1, 50000, None, &[])).await;
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let deadline = Instant::now() + Duration::from_secs(30);
    let message = loop {
        let found = events
            .list(&Default::default())
            .await
            .expect("events")
            .items
            .into_iter()
            .filter(|e| {
                e.involved_object.name.as_deref() == Some("too-big")
                    && e.reason.as_deref() == Some("FailedScheduling")
            })
            .find_map(|e| e.message);
        if let Some(message) = found {
            break message;
        }
        assert!(
            Instant::now() < deadline,
            "no FailedScheduling event\n{}",
            logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(message.contains("50000"), "{message}");
    assert_eq!(node_of(&client, "too-big").await, None);
    plugin.abort();
    tessera_test_support::terminate(scheduler, Duration::from_secs(5));
}
