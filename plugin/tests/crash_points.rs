//! Crash safety: the real `tessera-device-plugin`, killed (SIGKILL, by its
//! own crash point) at every step of Allocate and of reclaim, then started
//! again: no GI or CI leaked, no GI named twice, no spec or allocation
//! directory without its record, a hand-made GI never touched; a pod whose
//! Allocate died is `bind-phase: failed` with the bind lock released, and a
//! pod whose reclaim died is reclaimed by the restarted plugin. Last, a
//! plugin restart with a running pod keeps its instance.
//!
//! One simulated node for every point (see `common::crash`). Needs root and
//! `tessera-sim` built; the prerequisite rule skips (locally) or fails (CI).

mod common;

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use common::crash::{Harness, ready};
use common::eventually;
use tessera_model::contract::annotations;
use tessera_model::mig::Placement;
use tessera_plugin::checkpoint::Phase;
use tessera_plugin::failpoint::POINTS;

fn bind_phase(pod: &k8s_openapi::api::core::v1::Pod) -> Option<String> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotations::BIND_PHASE))
        .cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_the_plugin_at_every_step_leaks_nothing() -> Result<()> {
    if !ready() {
        return Ok(());
    }
    let mut h = Harness::start().await?;
    let foreign = vec![h.hand_made(Placement::new(6, 1)?)?];
    let placement = Placement::new(0, 1)?;
    ensure!(
        POINTS.iter().any(|p| p.starts_with("allocate:"))
            && POINTS.iter().any(|p| p.starts_with("reclaim:")),
        "crash points of both Allocate and reclaim expected: {POINTS:?}"
    );

    for (i, point) in POINTS.iter().enumerate() {
        let name = format!("crash-{i}");
        let context = format!("crash at {point}");
        h.start_plugin(Some(point)).await?;
        let pod = h.reserve(&name, placement).await?;
        let uid = pod.uid.clone();
        if point.starts_with("allocate:") {
            let answer = h.allocate().await?;
            ensure!(
                answer.is_err(),
                "{context}: Allocate answered although the plugin was to die: {answer:?}"
            );
            ensure!(
                h.wait_crash(Duration::from_secs(10)).await?,
                "{context}: the plugin did not die by SIGKILL:\n{}",
                h.log_text()
            );
            // The startup sweep runs before the plugin registers.
            h.start_plugin(None).await?;
            h.check_invariants(&foreign, &context)?;
            ensure!(
                h.gis()? == foreign,
                "{context}: GIs {:?} after the sweep; only the hand-made one should be left",
                h.gis()?
            );
            let checkpoint = h.checkpoint()?;
            ensure!(
                checkpoint.allocations.values().all(|r| r.pod_uid != uid),
                "{context}: the dead Allocate's record stayed: {checkpoint:?}"
            );
            let pod = h.pod(&name).await?.context("the pod vanished")?;
            ensure!(
                bind_phase(&pod).as_deref() == Some(annotations::bind_phase::FAILED),
                "{context}: bind-phase {:?}, expected failed:\n{}",
                bind_phase(&pod),
                h.log_text()
            );
            ensure!(
                h.lease_holder()
                    .await?
                    .is_none_or(|holder| !holder.ends_with(&uid)),
                "{context}: the bind lock still names the failed pod"
            );
        } else {
            let answer = h.allocate().await?;
            ensure!(
                answer.is_ok(),
                "{context}: Allocate failed: {answer:?}\n{}",
                h.log_text()
            );
            ensure!(
                h.gis()?.iter().any(|g| g.placement == placement),
                "{context}: no GI at the reserved placement after Allocate"
            );
            h.delete(&name).await?;
            ensure!(
                h.wait_crash(Duration::from_secs(20)).await?,
                "{context}: the plugin did not die by SIGKILL during reclaim:\n{}",
                h.log_text()
            );
            h.start_plugin(None).await?;
            h.check_invariants(&foreign, &context)?;
            eventually(Duration::from_secs(15), &context, || {
                Ok(h.gis()? == foreign
                    && h.checkpoint()?.allocations.is_empty()
                    && h.spec_ids()?.is_empty()
                    && h.alloc_dirs()?.is_empty())
            })
            .await
            .with_context(|| h.log_text())?;
        }
        h.kill_plugin();
        h.delete(&name).await.ok();
        eprintln!("crash point {point}: the restarted plugin left nothing behind");
    }

    // A plugin restart with a running pod keeps its instance and spec.
    h.start_plugin(None).await?;
    let pod = h.reserve("survivor", placement).await?;
    let uid = pod.uid.clone();
    let answer = h.allocate().await?;
    ensure!(
        answer.is_ok(),
        "Allocate failed: {answer:?}\n{}",
        h.log_text()
    );
    let before = h.gis()?;
    h.kill_plugin();
    h.start_plugin(None).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    h.check_invariants(&foreign, "restart with a running pod")?;
    ensure!(
        h.gis()? == before,
        "the running pod's GI changed across a restart"
    );
    let alloc_id = format!("{uid}-0");
    let record = h
        .checkpoint()?
        .allocations
        .get(&alloc_id)
        .cloned()
        .context("the running pod's record is gone")?;
    ensure!(record.phase == Phase::Ready, "record {record:?}");
    ensure!(
        h.spec_ids()?.contains(&alloc_id),
        "the running pod's spec is gone"
    );
    h.delete("survivor").await?;
    eventually(Duration::from_secs(15), "reclaim after the restart", || {
        Ok(h.gis()? == foreign && h.checkpoint()?.allocations.is_empty())
    })
    .await
    .with_context(|| h.log_text())?;
    Ok(())
}
