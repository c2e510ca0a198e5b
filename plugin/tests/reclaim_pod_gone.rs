//! Reclaim through the real `tessera-device-plugin` on a simulated node:
//! a realized MIG allocation is destroyed (CI, then GI), its transient spec
//! and allocation directory removed and its record dropped within seconds of
//! its pod's deletion, or of its pod ending (`Succeeded`); a container
//! restart (its binding record replaced) keeps everything, and so does a
//! container still bound after the pod left the API; a GI made by hand on
//! the same GPU is never touched.
//!
//! Needs root and `tessera-sim` built; the prerequisite rule skips (locally)
//! or fails (CI).

mod common;

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use common::crash::{Harness, ready};
use common::{MIG_GPU, NS, eventually};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};
use tessera_driver::GpuDriver;
use tessera_model::alloc::BindingRecord;
use tessera_model::contract::node::{ALLOC_DIR, BINDING_FILE};
use tessera_model::mig::Placement;

/// Allocates a 1g.5gb instance at `start` for a new pod `name`; returns
/// the alloc-id.
async fn realize(h: &Harness, name: &str, start: u32) -> Result<String> {
    let pod = h.reserve(name, Placement::new(start, 1)?).await?;
    let uid = pod.uid.clone();
    let answer = h.allocate().await?;
    ensure!(
        answer.is_ok(),
        "{name}: Allocate failed: {answer:?}\n{}",
        h.log_text()
    );
    let id = format!("{uid}-0");
    ensure!(h.spec_ids()?.contains(&id), "{name}: no transient spec");
    ensure!(
        h.gis()?.iter().any(|g| g.placement.start == start),
        "{name}: no GI at slice {start}"
    );
    Ok(id)
}

/// Everything of `id` is there: record, spec, directory, the GI at `start`
/// with its CI.
fn intact(h: &Harness, id: &str, start: u32) -> Result<bool> {
    let gi = h.gis()?.into_iter().find(|g| g.placement.start == start);
    let has_ci = match gi {
        Some(gi) => h.driver.compute_instances(MIG_GPU, gi.id)?.len() == 1,
        None => false,
    };
    Ok(has_ci
        && h.checkpoint()?.allocations.contains_key(id)
        && h.spec_ids()?.contains(id)
        && h.alloc_dirs()?.contains(id))
}

/// Nothing of `id` is left and no GI sits at `start`.
fn gone(h: &Harness, id: &str, start: u32) -> Result<bool> {
    Ok(!h.gis()?.iter().any(|g| g.placement.start == start)
        && !h.checkpoint()?.allocations.contains_key(id)
        && !h.spec_ids()?.contains(id)
        && !h.alloc_dirs()?.contains(id))
}

/// A stand-in container process and its binding record.
fn bind(state_dir: &Path, id: &str, container: &str) -> Result<Child> {
    let child = Command::new("sleep").arg("120").spawn()?;
    let record = BindingRecord {
        alloc_id: id.to_owned(),
        container_id: container.to_owned(),
        pid: child.id(),
        cgroup: "/".to_owned(),
        cgroups: Default::default(),
        bundle: "/nonexistent".to_owned(),
        mode: "cdi".to_owned(),
        bound_at: 1,
    };
    let dir = state_dir.join(ALLOC_DIR).join(id);
    let tmp = dir.join(".binding.tmp");
    std::fs::write(&tmp, serde_json::to_vec(&record)?)?;
    std::fs::rename(&tmp, dir.join(BINDING_FILE))?;
    Ok(child)
}

fn stop(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_ended_pods_instances_and_files_are_reclaimed_and_nothing_else() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let mut h = Harness::start().await?;
    let hand_made = h.hand_made(Placement::new(6, 1)?)?;
    h.start_plugin(None).await?;

    // Deleted pod: reclaimed within a few seconds.
    let id = realize(&h, "deleted", 0).await?;
    let started = Instant::now();
    h.delete("deleted").await?;
    eventually(Duration::from_secs(5), "reclaim after deletion", || {
        gone(&h, &id, 0)
    })
    .await
    .with_context(|| h.log_text())?;
    eprintln!("deleted pod reclaimed in {:?}", started.elapsed());

    // A pod that ended (Succeeded) but still exists: reclaimed too.
    let id = realize(&h, "ended", 0).await?;
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), NS);
    pods.patch_status(
        "ended",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": {"phase": "Succeeded"}})),
    )
    .await?;
    eventually(
        Duration::from_secs(5),
        "reclaim after the pod ended",
        || gone(&h, &id, 0),
    )
    .await
    .with_context(|| h.log_text())?;

    // A container restart replaces the binding: everything stays.
    let id = realize(&h, "restarted", 1).await?;
    let state_dir = h.state_dir();
    let first = bind(&state_dir, &id, "c1")?;
    stop(first);
    let second = bind(&state_dir, &id, "c2")?;
    // Wake the reconciler with a pod change and give it time to act.
    pods.patch(
        "restarted",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"labels": {"poke": "1"}}})),
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    ensure!(
        intact(&h, &id, 1)?,
        "a container restart lost the allocation\n{}",
        h.log_text()
    );

    // The pod leaves the API while its container is still bound: kept.
    h.delete("restarted").await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    ensure!(
        intact(&h, &id, 1)?,
        "reclaimed while a container was still bound\n{}",
        h.log_text()
    );
    // The container ends (its process gone): the reconciler re-checks a
    // lingering record every 250 ms, so it goes within about a second (not
    // at the 10 s resync).
    stop(second);
    let ended = Instant::now();
    eventually(
        Duration::from_millis(1500),
        "reclaim within ~1 s of the last container's end",
        || gone(&h, &id, 1),
    )
    .await
    .with_context(|| h.log_text())?;
    eprintln!(
        "lingering allocation reclaimed {:?} after its container ended",
        ended.elapsed()
    );

    ensure!(
        h.gis()? == vec![hand_made],
        "the hand-made GI was touched: {:?}",
        h.gis()?
    );
    ensure!(
        h.driver.compute_instances(MIG_GPU, hand_made.id)?.len() == 1,
        "the hand-made GI's CI was touched"
    );
    ensure!(h.plugin_runs(), "the plugin exited:\n{}", h.log_text());
    h.kill_plugin();
    Ok(())
}
