//! Allocate of vGPU slices on a simulated node against the stand-in API
//! server: the limits file, the accounting directory and the transient spec
//! with the vGPU library, preload list and HAMi-core env, answered in every
//! form (`--cdi-mode all`); a pod with an init and a regular container
//! realized one Allocate each, in index order, with `success` and the lock
//! released only after the last; and two pods in flight on one node never
//! get each other's reservations (the lock's holder is served; without a
//! holder exactly one allocating pod is served; two are refused).
//!
//! Needs root (the node's device nodes) and `tessera-sim` built.

mod common;

use std::os::unix::fs::PermissionsExt;

use anyhow::{Context, Result};
use common::*;
use serde_json::json;
use tessera_driver::GpuDriver;
use tessera_model::cdi::Spec;
use tessera_model::contract::annotations;
use tessera_model::vgpu::VgpuConfig;
use tessera_plugin::api::deviceplugin::v1beta1::{
    ContainerPreferredAllocationRequest, PreferredAllocationRequest,
};
use tessera_plugin::config::CdiMode;

fn share(uuid: &str, memory: u64, cores: u32) -> serde_json::Value {
    json!({"uuid": uuid, "mode": "share", "memoryMiB": memory, "cores": cores})
}

fn mode_of(path: &std::path::Path) -> u32 {
    std::fs::metadata(path).expect("stat").permissions().mode() & 0o777
}

fn limits_of(w: &World, id: &str) -> Result<VgpuConfig> {
    let path = w
        .ctx
        .config
        .state_dir
        .join("alloc")
        .join(id)
        .join("vgpu.json");
    Ok(VgpuConfig::parse(&std::fs::read_to_string(path)?)?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_pod_gets_its_slice_in_every_form() -> Result<()> {
    let Some(w) = world(CdiMode::All).await? else {
        return Ok(());
    };
    let h100 = w.driver.gpus()?[SHARE_GPU as usize].clone();
    let pod = bind_pod(
        &w.kube,
        "slice",
        &["main"],
        &one_container(json!([share(&h100.uuid, 4096, 30)])),
        true,
    )
    .await?;
    let id = alloc_id(&pod, 0);
    let response = w.allocator.allocate(request(&["gpu-0-3"])).await?;
    let answer = &response.container_responses[0];
    assert_eq!(answer.cdi_devices[0].name, format!("tessera.io/alloc={id}"));
    let key = answer.annotations.keys().next().context("CDI annotation")?;
    assert!(
        key.starts_with("cdi.k8s.io/tessera_") && key.len() - "cdi.k8s.io/".len() <= 63,
        "{key}"
    );
    assert_eq!(answer.annotations[key], format!("tessera.io/alloc={id}"));
    assert_eq!(answer.envs.get("TESSERA_ALLOC_ID"), Some(&id));
    assert_eq!(
        answer
            .envs
            .get("CUDA_DEVICE_MEMORY_LIMIT_0")
            .map(String::as_str),
        Some("4096m")
    );
    assert_eq!(
        answer
            .envs
            .get("CUDA_DEVICE_SM_LIMIT_0")
            .map(String::as_str),
        Some("30")
    );
    assert!(!answer.envs.contains_key("CUDA_OVERSUBSCRIBE"));
    assert!(
        answer
            .devices
            .iter()
            .any(|d| d.container_path == format!("/dev/nvidia{}", h100.minor))
    );
    assert!(
        answer
            .devices
            .iter()
            .any(|d| d.container_path == "/dev/nvidiactl")
    );
    let mount = |target: &str| {
        answer
            .mounts
            .iter()
            .find(|m| m.container_path == target)
            .cloned()
    };
    let library = mount("/usr/local/tessera/libtessera_vgpu.so").context("library mount")?;
    assert!(library.read_only);
    assert!(mount("/etc/ld.so.preload").context("preload")?.read_only);
    assert!(
        mount("/usr/local/tessera/vgpu.json")
            .context("limits")?
            .read_only
    );
    assert!(!mount("/var/run/tessera").context("accounting")?.read_only);

    let limits = limits_of(&w, &id)?;
    assert_eq!(limits.devices.len(), 1);
    assert_eq!(limits.devices[0].uuid, h100.uuid);
    assert_eq!(
        (
            limits.devices[0].memory_limit_mib,
            limits.devices[0].sm_limit_percent
        ),
        (4096, 30)
    );
    let dir = w.ctx.config.state_dir.join("alloc").join(&id);
    assert_eq!(mode_of(&dir), 0o700);
    assert_eq!(mode_of(&dir.join("accounting")), 0o755);
    assert_eq!(mode_of(&dir.join("accounting/vgpu.accounting")), 0o666);
    assert_eq!(mode_of(&dir.join("vgpu.json")), 0o644);
    let preload = w.ctx.config.state_dir.join("ld.so.preload");
    assert_eq!(
        std::fs::read_to_string(&preload)?,
        "/usr/local/tessera/libtessera_vgpu.so\n"
    );
    let spec: Spec = serde_json::from_slice(&std::fs::read(transient_spec_path(&w, &id))?)?;
    spec.validate_tessera()
        .map_err(|p| anyhow::anyhow!("{p:?}"))?;
    let hooks: Vec<&str> = spec.devices[0]
        .container_edits
        .hooks
        .iter()
        .map(|h| h.hook_name.as_str())
        .collect();
    assert_eq!(hooks, ["createContainer", "poststop"]);
    assert!(
        spec.devices[0]
            .container_edits
            .hooks
            .iter()
            .all(|h| !h.env.is_empty())
    );

    let a = pod_annotations(&w.kube, "slice").await?;
    assert_eq!(
        a.get(annotations::BIND_PHASE).map(String::as_str),
        Some("success")
    );
    assert_eq!(lease_holder(&w.kube).await?, None);
    // Nothing was made on the GPU.
    assert!(w.driver.gpu_instances(MIG_GPU)?.is_empty());

    // Once the pod is no longer allocating, the same request is still
    // answered the same (kubelet may ask again), from the record and files.
    let again = w.allocator.allocate(request(&["gpu-0-3"])).await?;
    assert_eq!(again, response);

    // A `success` that never landed (the pod still allocating, every
    // container realized): the next Allocate finishes it, and still answers.
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(w.kube.clone(), NS);
    pods.patch(
        "slice",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(
            &json!({"metadata": {"annotations": {annotations::BIND_PHASE: "allocating"}}}),
        ),
    )
    .await?;
    let repaired = w.allocator.allocate(request(&["gpu-0-3"])).await?;
    assert_eq!(repaired, response);
    let a = pod_annotations(&w.kube, "slice").await?;
    assert_eq!(
        a.get(annotations::BIND_PHASE).map(String::as_str),
        Some("success")
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_are_realized_in_index_order_and_pods_in_flight_never_swap() -> Result<()> {
    let Some(w) = world(CdiMode::CdiField).await? else {
        return Ok(());
    };
    let h100 = w.driver.gpus()?[SHARE_GPU as usize].clone();

    // An init container (index 0) and a regular one (index 1).
    let text = json!({"version": 1, "node": NODE, "containers": [
        {"index": 0, "name": "setup", "init": true, "devices": [share(&h100.uuid, 1000, 10)]},
        {"index": 1, "name": "main", "devices": [share(&h100.uuid, 2000, 20)]},
    ]})
    .to_string();
    let two = bind_pod(&w.kube, "two", &["setup", "main"], &text, true).await?;
    // kubelet asks which ids to take: the reserved GPU's first.
    let a100 = w.driver.gpus()?[MIG_GPU as usize].uuid.clone();
    let preferred = w
        .allocator
        .preferred_allocation(PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: vec![format!("{a100}::mig0"), format!("{}::7", h100.uuid)],
                must_include_device_i_ds: vec![],
                allocation_size: 1,
            }],
        })
        .await?;
    assert_eq!(
        preferred.container_responses[0].device_i_ds,
        [format!("{}::7", h100.uuid)]
    );
    w.allocator.allocate(request(&["a"])).await?;
    assert_eq!(
        limits_of(&w, &alloc_id(&two, 0))?.devices[0].memory_limit_mib,
        1000
    );
    let a = pod_annotations(&w.kube, "two").await?;
    assert_eq!(
        a.get(annotations::BIND_PHASE).map(String::as_str),
        Some("allocating"),
        "one container left"
    );
    assert_eq!(
        lease_holder(&w.kube).await?,
        Some(two.holder()),
        "the lock stays until the last"
    );
    w.allocator.allocate(request(&["b"])).await?;
    assert_eq!(
        limits_of(&w, &alloc_id(&two, 1))?.devices[0].memory_limit_mib,
        2000
    );
    let a = pod_annotations(&w.kube, "two").await?;
    assert_eq!(
        a.get(annotations::BIND_PHASE).map(String::as_str),
        Some("success")
    );
    assert_eq!(lease_holder(&w.kube).await?, None);

    // Pod "stale" is left in allocating with no lock; pod "holder" holds it.
    // The holder is served, with its own reservation.
    let stale = bind_pod(
        &w.kube,
        "stale",
        &["main"],
        &one_container(json!([share(&h100.uuid, 3000, 30)])),
        false,
    )
    .await?;
    let holder = bind_pod(
        &w.kube,
        "holder",
        &["main"],
        &one_container(json!([share(&h100.uuid, 4000, 40)])),
        true,
    )
    .await?;
    w.allocator.allocate(request(&["c"])).await?;
    assert_eq!(
        limits_of(&w, &alloc_id(&holder, 0))?.devices[0].memory_limit_mib,
        4000
    );
    assert!(
        w.ctx.checkpoint.get(&alloc_id(&stale, 0)).is_none(),
        "the stale pod got nothing"
    );
    let record = w
        .ctx
        .checkpoint
        .get(&alloc_id(&holder, 0))
        .context("record")?;
    assert_eq!(
        (record.pod.as_str(), record.pod_uid.as_str()),
        ("holder", holder.uid.as_str())
    );

    // No holder now: the one pod in allocating is served.
    w.allocator.allocate(request(&["d"])).await?;
    assert_eq!(
        limits_of(&w, &alloc_id(&stale, 0))?.devices[0].memory_limit_mib,
        3000
    );

    // Two pods in allocating and no holder: refused, neither gets anything.
    let p = bind_pod(
        &w.kube,
        "p",
        &["main"],
        &one_container(json!([share(&h100.uuid, 5000, 50)])),
        false,
    )
    .await?;
    let q = bind_pod(
        &w.kube,
        "q",
        &["main"],
        &one_container(json!([share(&h100.uuid, 6000, 60)])),
        false,
    )
    .await?;
    let err = w
        .allocator
        .allocate(request(&["e"]))
        .await
        .expect_err("ambiguous");
    println!("{}", err.message());
    assert!(
        err.message().contains("default/p, default/q")
            && err.message().contains("refusing to guess"),
        "{}",
        err.message()
    );
    assert!(w.ctx.checkpoint.get(&alloc_id(&p, 0)).is_none());
    assert!(w.ctx.checkpoint.get(&alloc_id(&q, 0)).is_none());
    // Once the lock names q, q is served with q's reservation.
    take_lease(&w.kube, &q).await?;
    // q's bind-time must be no earlier than the lock: re-stamp it as a bind would.
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(w.kube.clone(), NS);
    pods.patch(
        "q",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&json!({"metadata": {"annotations": {
            annotations::BIND_TIME: k8s_openapi::jiff::Timestamp::now().to_string()}}})),
    )
    .await?;
    w.allocator.allocate(request(&["f"])).await?;
    assert_eq!(
        limits_of(&w, &alloc_id(&q, 0))?.devices[0].memory_limit_mib,
        6000
    );
    assert!(w.ctx.checkpoint.get(&alloc_id(&p, 0)).is_none());
    Ok(())
}

/// A plugin in a container sees the host's driver root elsewhere (the
/// DaemonSet mounts the host's `/` at `/driver-root`): with
/// `--host-driver-root` the spec the runtime reads on the host names host
/// paths only, and every one of them exists there. The container's view is
/// a symlink to the node root here, so discovery finds the same files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_seeing_the_driver_elsewhere_names_host_paths() -> Result<()> {
    let Some(w) = world(CdiMode::CdiField).await? else {
        return Ok(());
    };
    let seen = w.sim.dir().join("driver-root");
    std::os::unix::fs::symlink(w.sim.root(), &seen)?;
    let h100 = w.driver.gpus()?[SHARE_GPU as usize].clone();
    // host_paths(pod, host root): the spec's host paths for a pod allocated by
    // a plugin that sees the driver root at `seen`.
    let host_paths = async |pod: &str, host_root: &std::path::Path| -> Result<Vec<String>> {
        let mut config = w.ctx.config.clone();
        config.driver_root = seen.clone();
        config.host_driver_root = host_root.to_owned();
        let allocator = tessera_plugin::allocate::Allocator::new(std::sync::Arc::new(
            tessera_plugin::run::NodeContext {
                config,
                driver: w.ctx.driver.clone(),
                client: w.kube.clone(),
                checkpoint: w.ctx.checkpoint.clone(),
            },
        ));
        let pod = bind_pod(
            &w.kube,
            pod,
            &["main"],
            &one_container(json!([share(&h100.uuid, 1024, 0)])),
            true,
        )
        .await?;
        let id = alloc_id(&pod, 0);
        allocator.allocate(request(&["gpu-0-1"])).await?;
        let spec: Spec = serde_json::from_slice(&std::fs::read(transient_spec_path(&w, &id))?)?;
        let edits = &spec.devices[0].container_edits;
        let mut paths: Vec<String> = edits.mounts.iter().map(|m| m.host_path.clone()).collect();
        paths.extend(
            edits
                .device_nodes
                .iter()
                .map(|n| n.host_path.clone().unwrap_or_else(|| n.path.clone())),
        );
        Ok(paths)
    };

    // Control: told nothing (the host root is what it sees), the plugin
    // names its own view, which the host's runtime could not resolve.
    let unmapped = host_paths("unmapped", &seen).await?;
    let in_view = unmapped
        .iter()
        .filter(|p| std::path::Path::new(p).starts_with(&seen))
        .count();
    assert!(
        in_view >= 3,
        "the control names no path below {seen:?}: {unmapped:?}"
    );

    let mapped = host_paths("mapped", w.sim.root()).await?;
    let below_root: Vec<&String> = mapped
        .iter()
        .filter(|p| std::path::Path::new(p).starts_with(w.sim.root()))
        .collect();
    // The driver's libraries and the device nodes, now under their host paths.
    assert_eq!(below_root.len(), in_view, "{mapped:?}");
    for path in &mapped {
        assert!(
            !std::path::Path::new(path).starts_with(&seen),
            "{path} is the plugin's view, not the host's"
        );
    }
    for path in below_root {
        assert!(
            std::fs::symlink_metadata(path).is_ok(),
            "{path} does not exist on the host"
        );
    }
    Ok(())
}
