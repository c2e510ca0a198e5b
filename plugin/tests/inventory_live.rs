//! The inventory publisher against a simulated node (profile `demo`, NVML
//! stand-in loaded in this process) and the stand-in API server: the Node
//! gets a `tessera.io/node-gpus` the extender's parser accepts, with NVML's
//! placements, even when the Node is registered only after the publisher
//! started (API errors retried); a health change is published at once; and a
//! GPU instance made by hand appears in `foreignInstances` within seconds.
//!
//! Needs root (the node's device nodes) and `tessera-sim` built; the
//! prerequisite rule skips (locally) or fails (CI) without them.

mod common;

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use tessera_driver::GpuDriver;
use tessera_model::contract::annotations;
use tessera_model::mig::Placement;
use tessera_model::sched::inventory::NodeGpus;
use tessera_plugin::config::CdiMode;
use tessera_plugin::health::{GpuHealth, HealthMap};
use tessera_plugin::inventory;
use tessera_test_support::kube::{Cluster, client};
use tessera_test_support::node::SimNode;
use tessera_test_support::require;
use tokio::sync::watch;

use common::{MIG_GPU, NODE, sim_context, sim_needs};

async fn annotation(nodes: &Api<Node>) -> Result<Option<(String, String)>> {
    let node = nodes.get(NODE).await?;
    let a = node.metadata.annotations.unwrap_or_default();
    Ok(a.get(annotations::NODE_GPUS)
        .cloned()
        .zip(a.get(annotations::NODE_HANDSHAKE).cloned()))
}

/// Waits until the published inventory satisfies `done`.
async fn wait_for(
    nodes: &Api<Node>,
    within: Duration,
    what: &str,
    done: impl Fn(&NodeGpus) -> bool,
) -> Result<(NodeGpus, String, Duration)> {
    let start = Instant::now();
    let mut last = None;
    while start.elapsed() < within {
        if let Some((text, handshake)) = annotation(nodes).await? {
            let inventory = NodeGpus::parse(&text)
                .with_context(|| format!("the extender's parser refused {text}"))?;
            if done(&inventory) {
                return Ok((inventory, handshake, start.elapsed()));
            }
            last = Some(text);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("{what}: not within {within:?}; last annotation {last:?}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_inventory_follows_nvml() -> Result<()> {
    let Ok(()) = require(&sim_needs()) else {
        return Ok(());
    };
    let Ok(sim) = SimNode::profile("demo").build() else {
        return Ok(());
    };
    let cluster = Cluster::get()?;
    let kube = client(cluster.kubeconfig()).await?;
    let nodes: Api<Node> = Api::all(kube.clone());
    let node: Node = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}},
        "spec": {},
    }))?;

    let (driver, ctx) = sim_context(&sim, &kube, CdiMode::CdiField)?;
    let (health_tx, health_rx) = watch::channel(HealthMap::new());
    let (stop_tx, stop_rx) = watch::channel(false);
    let task = tokio::spawn(inventory::run(ctx, health_rx, stop_rx));

    // The Node does not exist yet: the patches fail (404) and are retried
    // with backoff; once kubelet (here: the test) registers it, it gets the
    // annotations.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!task.is_finished(), "the publisher survives API errors");
    nodes.create(&PostParams::default(), &node).await?;

    // First publication: every GPU, NVML's profiles and placements, the
    // demo's three instances foreign (no checkpoint names them).
    let (first, handshake, took) =
        wait_for(&nodes, Duration::from_secs(10), "first inventory", |_| true).await?;
    println!("first inventory after {took:?}");
    let handshake: Timestamp = handshake.parse().context("handshake is RFC 3339")?;
    assert!(
        Timestamp::now().duration_since(handshake).abs() < jiff_secs(60),
        "{handshake}"
    );
    let gpus = driver.gpus()?;
    assert_eq!(first.gpus.len(), gpus.len());
    for (reported, nvml) in first.gpus.iter().zip(&gpus) {
        assert_eq!(
            (&reported.uuid, reported.index, &reported.model),
            (&nvml.uuid, nvml.index, &nvml.name)
        );
        assert_eq!(reported.mig, nvml.mig_enabled());
        assert!(reported.healthy);
    }
    let a100 = first.gpu(&gpus[MIG_GPU as usize].uuid).context("MIG GPU")?;
    assert!(!a100.mig_profiles.is_empty());
    for profile in &a100.mig_profiles {
        assert_eq!(
            profile.placements,
            driver.possible_placements(MIG_GPU, profile.id)?,
            "profile {} placements as NVML reports them",
            profile.name
        );
    }
    let mut existing: Vec<Placement> = driver
        .gpu_instances(MIG_GPU)?
        .iter()
        .map(|gi| gi.placement)
        .collect();
    existing.sort();
    assert_eq!(a100.foreign_instances, existing);

    // A health change is published at once (no poll interval to wait for).
    let mut sick = HealthMap::new();
    sick.insert(
        gpus[0].uuid.clone(),
        GpuHealth {
            healthy: false,
            reason: Some("XID 79".to_owned()),
        },
    );
    health_tx.send(sick)?;
    let (_, _, took) = wait_for(&nodes, Duration::from_secs(5), "GPU 0 unhealthy", |inv| {
        inv.gpu(&gpus[0].uuid).is_some_and(|g| !g.healthy)
    })
    .await?;
    println!("unhealthy GPU published after {took:?}");

    // A GI made by hand on a free slot: foreign within a few seconds.
    let free = driver
        .possible_placements(MIG_GPU, 19)?
        .into_iter()
        .find(|p| {
            existing
                .iter()
                .all(|e| p.end() <= e.start || e.end() <= p.start)
        })
        .with_context(|| format!("a free 1g.5gb slot beside {existing:?}"))?;
    let gi = driver.create_gpu_instance(MIG_GPU, 19, free)?;
    let (after, _, took) = wait_for(
        &nodes,
        Duration::from_secs(6),
        "the hand-made GI in foreignInstances",
        |inv| {
            inv.gpu(&gpus[MIG_GPU as usize].uuid)
                .is_some_and(|g| g.foreign_instances.contains(&free))
        },
    )
    .await?;
    println!("hand-made GI reported foreign after {took:?}");
    assert_eq!(
        after
            .gpu(&gpus[MIG_GPU as usize].uuid)
            .unwrap()
            .foreign_instances
            .len(),
        existing.len() + 1
    );
    driver.destroy_gpu_instance(MIG_GPU, gi.id)?;
    wait_for(
        &nodes,
        Duration::from_secs(6),
        "the destroyed GI gone from foreignInstances",
        |inv| {
            inv.gpu(&gpus[MIG_GPU as usize].uuid)
                .is_some_and(|g| !g.foreign_instances.contains(&free))
        },
    )
    .await?;

    stop_tx.send(true)?;
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .context("the publisher stops on shutdown")??;
    Ok(())
}

fn jiff_secs(s: i64) -> k8s_openapi::jiff::SignedDuration {
    k8s_openapi::jiff::SignedDuration::from_secs(s)
}
