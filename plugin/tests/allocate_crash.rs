//! Allocate killed (SIGKILL, by its crash points) at every step of a MIG
//! reservation: each time, the checkpoint the killed process left covers
//! everything that exists (an intent before the GI, the ids after), so undoing
//! from the record alone (what the startup sweep does) leaves no GI, no CI,
//! no spec and no allocation directory.
//!
//! The parent runs this test binary again as its child (the ignored test
//! `crash_child`) with `TESSERA_PLUGIN_CRASH_AT` set, on the same simulated
//! node (GI state lives in the node's state file) and API server.
//!
//! Needs root (the node's device nodes) and `tessera-sim` built.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use common::*;
use serde_json::json;
use tessera_driver::GpuDriver;
use tessera_driver::devices::find_nvml_library;
use tessera_driver::nvml::NvmlDriver;
use tessera_model::contract::annotations;
use tessera_model::sched::allocation::DeviceAllocation;
use tessera_plugin::allocate::{Allocator, destroy_instances, remove_alloc_files};
use tessera_plugin::checkpoint::{Phase, Store};
use tessera_plugin::config::CdiMode;
use tessera_plugin::failpoint;
use tessera_plugin::run::NodeContext;

const ROOT_ENV: &str = "ALLOC_CRASH_ROOT";
const STATE_ENV: &str = "ALLOC_CRASH_STATE";
const KUBECONFIG_ENV: &str = "ALLOC_CRASH_KUBECONFIG";

fn env_path(name: &str) -> Result<PathBuf> {
    std::env::var_os(name)
        .map(PathBuf::from)
        .with_context(|| format!("{name} is set by the parent test"))
}

/// The child: one Allocate on the node the parent names; it must die at the
/// crash point, so returning at all is a failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the child of allocate_dies_at_every_crash_point_leaving_a_record_that_covers_it"]
async fn crash_child() -> Result<()> {
    let root = env_path(ROOT_ENV)?;
    let state_dir = env_path(STATE_ENV)?;
    let kube = tessera_test_support::kube::client(&env_path(KUBECONFIG_ENV)?).await?;
    let driver = Arc::new(NvmlDriver::load(&find_nvml_library(&root)?)?);
    let ctx = Arc::new(NodeContext {
        config: config(&root, &state_dir, CdiMode::CdiField),
        driver,
        client: kube,
        checkpoint: Arc::new(Store::open(&state_dir)?),
    });
    let result = Allocator::new(ctx).allocate(request(&["crash-0"])).await;
    bail!("Allocate returned instead of dying at the crash point: {result:?}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_dies_at_every_crash_point_leaving_a_record_that_covers_it() -> Result<()> {
    let Some(w) = world(CdiMode::CdiField).await? else {
        return Ok(());
    };
    let a100 = w.driver.gpus()?[MIG_GPU as usize].clone();
    let profile = w.one_slice_profile()?;
    let state_dir = w.ctx.config.state_dir.clone();
    let points: Vec<&str> = failpoint::POINTS
        .iter()
        .copied()
        .filter(|p| p.starts_with("allocate:"))
        .collect();
    assert!(points.len() >= 6, "{points:?}");
    for (n, point) in points.iter().enumerate() {
        let name = format!("crash-{n}");
        let text = one_container(json!([{"uuid": a100.uuid, "mode": "mig",
            "profile": profile.name, "profileId": profile.id,
            "placement": {"start": 2, "size": 1}}]));
        let pod = bind_pod(&w.kube, &name, &["main"], &text, true).await?;
        let id = alloc_id(&pod, 0);
        let out = Command::new(std::env::current_exe()?)
            .args(["--ignored", "--exact", "crash_child", "--nocapture"])
            .env(failpoint::ENV, point)
            .env(ROOT_ENV, w.sim.root())
            .env(STATE_ENV, &state_dir)
            .env(KUBECONFIG_ENV, w.cluster.kubeconfig())
            .output()?;
        let log = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.signal(),
            Some(9),
            "{point}: died by SIGKILL\n{log}"
        );
        assert!(
            log.contains(&format!("crash point {point} reached")),
            "{point}: {log}"
        );

        // What the killed process recorded, against what exists.
        let store = Store::open(&state_dir)?;
        let record = store
            .get(&id)
            .with_context(|| format!("{point}: a record"))?;
        let gis = w.driver.gpu_instances(MIG_GPU)?;
        let instance = &record.instances[0];
        let spec = transient_spec_path(&w, &id);
        match *point {
            failpoint::ALLOCATE_AFTER_INTENT => {
                assert!(gis.is_empty(), "{point}: {gis:?}");
                assert_eq!(instance.gpu_instance_id, None);
            }
            failpoint::ALLOCATE_AFTER_GI => {
                assert_eq!(gis.len(), 1, "{point}");
                assert_eq!(
                    instance.gpu_instance_id, None,
                    "{point}: the id never reached the record"
                );
            }
            failpoint::ALLOCATE_AFTER_CI => {
                assert_eq!(instance.gpu_instance_id, Some(gis[0].id));
                assert_eq!(instance.compute_instance_id, None);
                assert_eq!(w.driver.compute_instances(MIG_GPU, gis[0].id)?.len(), 1);
            }
            failpoint::ALLOCATE_AFTER_ANNOTATION => {
                let allocation = pod_allocation(&w.kube, &name).await?;
                let realized = match &allocation.containers[0].devices[0] {
                    DeviceAllocation::Mig { realized, .. } => realized.clone(),
                    DeviceAllocation::Share { .. } => None,
                };
                assert_eq!(
                    realized.map(|r| r.mig_uuid),
                    instance.mig_uuid.clone(),
                    "{point}"
                );
                assert!(!spec.exists(), "{point}");
            }
            failpoint::ALLOCATE_AFTER_SPEC => {
                assert!(spec.exists(), "{point}");
                assert_eq!(record.phase, Phase::Realizing);
            }
            failpoint::ALLOCATE_BEFORE_SUCCESS => {
                assert_eq!(record.phase, Phase::Ready);
                let a = pod_annotations(&w.kube, &name).await?;
                assert_eq!(
                    a.get(annotations::BIND_PHASE).map(String::as_str),
                    Some("allocating")
                );
            }
            other => bail!("a crash point this test does not know: {other}"),
        }
        if *point != failpoint::ALLOCATE_AFTER_INTENT {
            assert_eq!(gis.len(), 1, "{point}: one GI");
            assert_eq!(
                gis[0].placement, instance.placement,
                "{point}: at the reserved placement"
            );
        }

        // Undo from the record alone: nothing is left.
        destroy_instances(w.driver.as_ref(), &record.instances)?;
        remove_alloc_files(&w.ctx.config, &id)?;
        store.update(|c| c.allocations.remove(&id))?;
        assert!(
            w.driver.gpu_instances(MIG_GPU)?.is_empty(),
            "{point}: no GI left"
        );
        assert!(!spec.exists(), "{point}: no spec left");
        assert!(
            !state_dir.join("alloc").join(&id).exists(),
            "{point}: no dir left"
        );
    }
    Ok(())
}
