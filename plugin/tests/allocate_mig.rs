//! Allocate of MIG reservations on a simulated node (NVML stand-in in this
//! process) against the stand-in API server: the GI lands at exactly the
//! reserved placement (read back through the driver) with a full CI, the
//! realized fields reach the pod's allocation, the transient spec is written
//! and valid, the bind lock is released and the pod's bind-phase is success;
//! a repeated Allocate is answered the same without touching the GPU; and
//! bad reservations (a placement held by a hand-made GI, MIG off, a GPU that
//! vanished, a corrupt annotation, a second device that fails after the
//! first was made) are each a clear error, `bind-phase: failed`, the lock
//! released, and nothing left.
//!
//! Needs root (the node's device nodes) and `tessera-sim` built.

mod common;

use anyhow::{Context, Result};
use common::*;
use serde_json::json;
use tessera_driver::GpuDriver;
use tessera_model::cdi::Spec;
use tessera_model::contract::annotations;
use tessera_model::mig::Placement;
use tessera_model::sched::allocation::DeviceAllocation;
use tessera_plugin::checkpoint::Phase;
use tessera_plugin::config::CdiMode;

fn mig_device(uuid: &str, profile: &str, id: u32, start: u32, size: u32) -> serde_json::Value {
    json!({"uuid": uuid, "mode": "mig", "profile": profile, "profileId": id,
           "placement": {"start": start, "size": size}})
}

/// Expects Allocate to fail with a message containing `needle`, then checks
/// the pod is `failed`, the lock released, and nothing of `id` left.
async fn expect_failure(w: &World, pod: &str, id: &str, ids: &[&str], needle: &str) -> Result<()> {
    let err = w
        .allocator
        .allocate(request(ids))
        .await
        .expect_err("the reservation cannot be realized");
    let message = err.message().to_owned();
    println!("{pod}: {message}");
    assert!(message.contains(needle), "{message:?} lacks {needle:?}");
    assert!(
        message.contains(&format!("{NS}/{pod}")),
        "names the pod: {message}"
    );
    let a = pod_annotations(&w.kube, pod).await?;
    assert_eq!(
        a.get(annotations::BIND_PHASE).map(String::as_str),
        Some("failed")
    );
    assert!(a.contains_key(annotations::BIND_TIME), "bind-time kept");
    assert_eq!(lease_holder(&w.kube).await?, None, "lock released");
    assert_eq!(nothing_left(w, id), Vec::<String>::new());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mig_reservations_are_realized_exactly_or_fail_leaving_nothing() -> Result<()> {
    let Some(w) = world(CdiMode::CdiField).await? else {
        return Ok(());
    };
    let gpus = w.driver.gpus()?;
    let a100 = gpus[MIG_GPU as usize].clone();
    let h100 = gpus[SHARE_GPU as usize].clone();
    assert!(a100.mig_enabled() && !h100.mig_enabled());
    let profile = w.one_slice_profile()?;
    let legal = w.driver.possible_placements(MIG_GPU, profile.id)?;
    assert!(legal.len() >= 6, "{legal:?}");
    let place = |start: u32| Placement {
        start,
        size: legal[0].size,
    };

    // 1. A MIG pod: the GI at exactly the reserved placement (not the first free one).
    let pod = bind_pod(
        &w.kube,
        "mig",
        &["main"],
        &one_container(json!([mig_device(
            &a100.uuid,
            &profile.name,
            profile.id,
            3,
            place(3).size
        )])),
        true,
    )
    .await?;
    let id = alloc_id(&pod, 0);
    let ids = ["mig-unit-0"];
    let response = w.allocator.allocate(request(&ids)).await?;
    let timings = w.allocator.last_timings().context("timings")?;
    println!("MIG allocate: {timings:?}");
    assert!(timings.driver > std::time::Duration::ZERO && timings.driver <= timings.total);
    let answer = &response.container_responses[0];
    assert_eq!(answer.cdi_devices.len(), 1);
    assert_eq!(answer.cdi_devices[0].name, format!("tessera.io/alloc={id}"));
    assert!(
        answer.annotations.is_empty() && answer.devices.is_empty(),
        "cdi-field mode only"
    );

    let gis = w.driver.gpu_instances(MIG_GPU)?;
    assert_eq!(gis.len(), 1, "{gis:?}");
    assert_eq!(
        (gis[0].placement, gis[0].profile_id),
        (place(3), profile.id)
    );
    let cis = w.driver.compute_instances(MIG_GPU, gis[0].id)?;
    assert_eq!(cis.len(), 1);
    let mig = w
        .driver
        .mig_devices(MIG_GPU)?
        .into_iter()
        .find(|m| m.gpu_instance_id == gis[0].id)
        .context("MIG device")?;

    let allocation = pod_allocation(&w.kube, "mig").await?;
    match &allocation.containers[0].devices[0] {
        DeviceAllocation::Mig {
            realized: Some(r), ..
        } => {
            assert_eq!(r.mig_uuid, mig.uuid);
            assert_eq!(r.gpu_instance_id, gis[0].id);
            assert_eq!(r.compute_instance_id, cis[0].id);
        }
        other => panic!("not realized: {other:?}"),
    }
    let a = pod_annotations(&w.kube, "mig").await?;
    assert_eq!(
        a.get(annotations::BIND_PHASE).map(String::as_str),
        Some("success")
    );
    assert_eq!(lease_holder(&w.kube).await?, None, "lock released");

    let spec_path = transient_spec_path(&w, &id);
    let spec: Spec = serde_json::from_slice(&std::fs::read(&spec_path)?)?;
    spec.validate_tessera()
        .map_err(|p| anyhow::anyhow!("{p:?}"))?;
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&spec_path)?.permissions());
    assert_eq!(mode & 0o777, 0o644);
    assert_eq!(spec.kind, "tessera.io/alloc");
    let edits = &spec.devices[0].container_edits;
    let caps: Vec<_> = edits
        .device_nodes
        .iter()
        .filter(|n| n.path.starts_with("/dev/nvidia-caps/"))
        .collect();
    assert_eq!(
        caps.len(),
        2,
        "GI and CI cap nodes: {:?}",
        edits.device_nodes
    );
    for cap in &caps {
        assert!(
            cap.major.is_some() && cap.minor.is_some() && cap.node_type.as_deref() == Some("c")
        );
    }
    assert!(
        edits
            .device_nodes
            .iter()
            .any(|n| n.path == format!("/dev/nvidia{}", a100.minor))
    );
    assert!(edits.env.contains(&format!("TESSERA_ALLOC_ID={id}")));
    assert!(
        !edits
            .mounts
            .iter()
            .any(|m| m.container_path == "/etc/ld.so.preload"),
        "a MIG-only container gets no preload"
    );
    assert!(
        edits
            .mounts
            .iter()
            .any(|m| m.container_path == "/var/run/tessera")
    );
    let dir = w.ctx.config.state_dir.join("alloc").join(&id);
    assert!(dir.join("accounting/vgpu.accounting").is_file());
    let record = w.ctx.checkpoint.get(&id).context("record")?;
    assert_eq!(record.phase, Phase::Ready);
    assert_eq!(record.instances[0].gpu_instance_id, Some(gis[0].id));
    assert_eq!(
        record.instances[0].mig_uuid.as_deref(),
        Some(mig.uuid.as_str())
    );

    // 2. The same Allocate again: the same answer, nothing new on the GPU.
    let again = w.allocator.allocate(request(&ids)).await?;
    assert_eq!(again, response);
    assert_eq!(w.driver.gpu_instances(MIG_GPU)?.len(), 1);

    // 3. A placement held by a GI made by hand.
    let foreign = w
        .driver
        .create_gpu_instance(MIG_GPU, profile.id, place(5))?;
    let pod = bind_pod(
        &w.kube,
        "taken",
        &["main"],
        &one_container(json!([mig_device(
            &a100.uuid,
            &profile.name,
            profile.id,
            5,
            place(5).size
        )])),
        true,
    )
    .await?;
    expect_failure(
        &w,
        "taken",
        &alloc_id(&pod, 0),
        &["x-0"],
        &format!(
            "placement 5+{} on {} is held by a GPU instance Tessera did not create (GI {})",
            place(5).size,
            a100.uuid,
            foreign.id
        ),
    )
    .await?;

    // 4. Two devices: the first is made, the second's placement is taken →
    // the first is destroyed again.
    let pod = bind_pod(
        &w.kube,
        "half",
        &["main"],
        &one_container(json!([
            mig_device(&a100.uuid, &profile.name, profile.id, 0, place(0).size),
            mig_device(&a100.uuid, &profile.name, profile.id, 5, place(5).size),
        ])),
        true,
    )
    .await?;
    expect_failure(
        &w,
        "half",
        &alloc_id(&pod, 0),
        &["y-0", "y-1"],
        "did not create",
    )
    .await?;
    let left: Vec<Placement> = w
        .driver
        .gpu_instances(MIG_GPU)?
        .iter()
        .map(|g| g.placement)
        .collect();
    assert!(
        !left.contains(&place(0)),
        "the first GI was undone: {left:?}"
    );
    assert_eq!(
        left.len(),
        2,
        "the first pod's and the hand-made GI stay: {left:?}"
    );

    // 5. MIG mode off on a GPU the reservation took for MIG.
    let pod = bind_pod(
        &w.kube,
        "mig-off",
        &["main"],
        &one_container(json!([mig_device(
            &h100.uuid,
            &profile.name,
            profile.id,
            0,
            1
        )])),
        true,
    )
    .await?;
    expect_failure(
        &w,
        "mig-off",
        &alloc_id(&pod, 0),
        &["z-0"],
        &format!("MIG mode is off on GPU {}", h100.uuid),
    )
    .await?;

    // 6. A GPU that vanished.
    let gone = "GPU-00000000-dead-beef-0000-000000000000";
    let pod = bind_pod(
        &w.kube,
        "vanished",
        &["main"],
        &one_container(json!([mig_device(
            gone,
            &profile.name,
            profile.id,
            1,
            place(1).size
        )])),
        true,
    )
    .await?;
    expect_failure(
        &w,
        "vanished",
        &alloc_id(&pod, 0),
        &["v-0"],
        &format!("GPU {gone} reserved"),
    )
    .await?;

    // 7. A corrupt allocation annotation.
    let pod = bind_pod(&w.kube, "corrupt", &["main"], "{\"node\": 5", true).await?;
    expect_failure(
        &w,
        "corrupt",
        &alloc_id(&pod, 0),
        &["c-0"],
        "the reservation cannot be read",
    )
    .await?;

    // Nothing else appeared on the GPU through all of it.
    assert_eq!(w.driver.gpu_instances(MIG_GPU)?.len(), 2);
    Ok(())
}
