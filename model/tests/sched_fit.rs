//! The scheduler's fit on whole nodes: the demos the issue names (gpushare's
//! binpack, a request that fits the node's total but no GPU, HAMi's dynamic
//! MIG example, the unified pool, a mixed node), the reasons users read, and
//! property tests that no sequence of binds and releases over-commits a GPU.
//!
//! Expected values are worked out by hand from `reference/mig.md` and the
//! catalogue's MiB figures (named where used), not read back from the fit.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use tessera_model::mig::Placement;
use tessera_model::mig::catalogue;
use tessera_model::sched::allocation::{Allocation, DeviceAllocation};
use tessera_model::sched::config::{ClusterConfig, MigAllowlistEntry, NodeSettings};
use tessera_model::sched::fit::{NodeFit, NodeUsage, NodeView, Unfit, allocation_for, fit};
use tessera_model::sched::inventory::{NodeGpu, NodeGpus};
use tessera_model::sched::request::{
    ContainerRequest, MemoryRequest, ModeRequest, PodRequest, Policy,
};

// ---------------------------------------------------------------- builders

/// A share GPU (MIG mode off) of a catalogue model.
fn share_gpu(index: u32, key: &str) -> NodeGpu {
    let model = catalogue::find(key).expect("catalogue model");
    NodeGpu::from_catalogue(model, index, format!("GPU-{index}"), false).expect("whole GPU")
}

/// A MIG GPU of a catalogue model; `reported`: with the profiles listed as
/// the device plugin reports them, else none (the catalogue fallback).
fn mig_gpu(index: u32, key: &str, reported: bool) -> NodeGpu {
    let model = catalogue::find(key).expect("catalogue model");
    let mut gpu =
        NodeGpu::from_catalogue(model, index, format!("GPU-{index}"), true).expect("MIG model");
    if !reported {
        gpu.mig_profiles.clear();
    }
    gpu
}

fn inventory(gpus: Vec<NodeGpu>) -> NodeGpus {
    let inventory = NodeGpus { version: 1, gpus };
    inventory.validate().expect("test inventory is valid");
    inventory
}

fn container(count: u32, memory: MemoryRequest, cores: u32) -> ContainerRequest {
    ContainerRequest {
        index: 0,
        name: "main".into(),
        init: false,
        count,
        memory,
        cores,
    }
}

fn pod(containers: Vec<ContainerRequest>, mode: ModeRequest) -> PodRequest {
    PodRequest {
        containers,
        mode,
        use_types: vec![],
        nouse_types: vec![],
        use_uuids: vec![],
        nouse_uuids: vec![],
        gpu_policy: None,
        node_policy: None,
    }
}

/// A pod of one container asking `count` GPUs of `mib` and `cores`.
fn ask(count: u32, mib: u64, cores: u32, mode: ModeRequest) -> PodRequest {
    pod(vec![container(count, MemoryRequest::Mib(mib), cores)], mode)
}

fn settings() -> NodeSettings {
    ClusterConfig::default().node_settings("node-1")
}

/// HAMi's allowlist for the A100-40GB in its dynamic-MIG documentation.
fn hami_a100_config() -> ClusterConfig {
    let mut config = ClusterConfig::default();
    config.nvidia.mig_profile_allowlist = vec![MigAllowlistEntry {
        models: vec!["A100-SXM4-40GB".into()],
        profiles: ["1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"]
            .map(String::from)
            .to_vec(),
    }];
    config
}

fn try_fit(
    request: &PodRequest,
    gpus: &NodeGpus,
    usage: &NodeUsage,
    settings: &NodeSettings,
    config: &ClusterConfig,
) -> Result<NodeFit, Unfit> {
    fit(
        request,
        NodeView {
            name: "node-1",
            inventory: gpus,
            usage,
            settings,
        },
        config,
    )
}

/// Fits on an idle node-1 with its default settings.
fn fit_empty(
    request: &PodRequest,
    gpus: &NodeGpus,
    config: &ClusterConfig,
) -> Result<NodeFit, Unfit> {
    try_fit(request, gpus, &NodeUsage::default(), &settings(), config)
}

/// The allocation on node-1 of one container `name` holding `devices`.
fn held(name: &str, devices: Vec<DeviceAllocation>) -> Allocation {
    allocation_for(
        "node-1",
        &NodeFit {
            containers: vec![tessera_model::sched::allocation::ContainerAllocation {
                index: 0,
                name: name.into(),
                init: false,
                devices,
            }],
            score: 0,
        },
    )
}

/// A reserved (not yet realized) MIG instance.
fn mig_held(
    uuid: &str,
    profile: &str,
    profile_id: u32,
    placement: Placement,
    memory_mib: u64,
) -> DeviceAllocation {
    DeviceAllocation::Mig {
        uuid: uuid.into(),
        profile: profile.into(),
        profile_id,
        placement,
        memory_mib,
        realized: None,
    }
}

fn share(uuid: &str, memory_mib: u64, cores: u32) -> DeviceAllocation {
    DeviceAllocation::Share {
        uuid: uuid.into(),
        memory_mib,
        cores,
    }
}

fn mig(
    uuid: &str,
    profile: &str,
    profile_id: u32,
    start: u32,
    size: u32,
) -> (String, String, u32, Placement) {
    let _ = profile_id;
    (
        uuid.into(),
        profile.into(),
        profile_id,
        Placement { start, size },
    )
}

fn mig_device(d: &DeviceAllocation) -> (String, String, u32, Placement) {
    match d {
        DeviceAllocation::Mig {
            uuid,
            profile,
            profile_id,
            placement,
            ..
        } => (uuid.clone(), profile.clone(), *profile_id, *placement),
        other => panic!("expected a MIG device, got {other:?}"),
    }
}

/// The MIG devices of a fit's first container.
fn mig_devices(fitted: &NodeFit) -> Vec<(String, String, u32, Placement)> {
    fitted.containers[0]
        .devices
        .iter()
        .map(mig_device)
        .collect()
}

// ---------------------------------------------------------------- demos

#[test]
fn binpack_puts_three_pods_onto_one_gpu() {
    // gpushare's demo: three 8000 MiB pods, two 40960 MiB GPUs, binpack.
    let gpus = inventory(vec![share_gpu(0, "A100-40GB"), share_gpu(1, "A100-40GB")]);
    let mut request = ask(1, 8000, 0, ModeRequest::Any);
    request.gpu_policy = Some(Policy::Binpack);
    let config = ClusterConfig::default();
    let mut allocations = Vec::new();
    for _ in 0..3 {
        let usage = NodeUsage::from_allocations(&allocations);
        let fitted = try_fit(&request, &gpus, &usage, &settings(), &config).expect("fits");
        allocations.push(allocation_for("node-1", &fitted));
    }
    let devices: Vec<&DeviceAllocation> = allocations
        .iter()
        .flat_map(|a| a.devices().map(|(_, d)| d))
        .collect();
    assert_eq!(devices, vec![&share("GPU-0", 8000, 0); 3]);
    let usage = NodeUsage::from_allocations(&allocations);
    assert_eq!(usage.gpus["GPU-0"].memory_mib, 24000);
    assert_eq!(usage.gpus["GPU-0"].slices, 3);
    // Spread would have used the empty GPU for the second pod.
    request.gpu_policy = Some(Policy::Spread);
    let usage = NodeUsage::from_allocations(&allocations[..1]);
    let fitted = try_fit(&request, &gpus, &usage, &settings(), &config).expect("fits");
    assert_eq!(fitted.containers[0].devices, [share("GPU-1", 8000, 0)]);
}

#[test]
fn a_request_that_fits_the_node_total_but_no_single_gpu() {
    // Two 40960 MiB GPUs with 30000 MiB held on each: 10960 free on each,
    // 21920 in all; 12000 fits the total and no GPU.
    let gpus = inventory(vec![share_gpu(0, "A100-40GB"), share_gpu(1, "A100-40GB")]);
    let held = Allocation {
        version: 1,
        node: "node-1".into(),
        containers: vec![tessera_model::sched::allocation::ContainerAllocation {
            index: 0,
            name: "big".into(),
            init: false,
            devices: vec![share("GPU-0", 30000, 0), share("GPU-1", 30000, 0)],
        }],
    };
    let usage = NodeUsage::from_allocations([&held]);
    let request = ask(1, 12000, 0, ModeRequest::Any);
    let err = try_fit(
        &request,
        &gpus,
        &usage,
        &settings(),
        &ClusterConfig::default(),
    )
    .expect_err("no GPU has 12000 MiB");
    assert_eq!(
        err.reason,
        "fits the node's total but no single GPU has 12000 MiB free"
    );
    // 10960 still fits one of them.
    let request = ask(1, 10960, 0, ModeRequest::Any);
    assert!(
        try_fit(
            &request,
            &gpus,
            &usage,
            &settings(),
            &ClusterConfig::default()
        )
        .is_ok()
    );
}

#[test]
fn hamis_dynamic_mig_example_gets_two_2g_10gb_on_distinct_gpus() {
    // gpu: 2, gpumem: 8000, vgpu-mode: mig on two A100-40GB MIG GPUs.
    // mig.md: 1g.5gb ≈ 4.75 GiB (< 8000 MiB), 2g.10gb ≈ 9.62 GiB (≈ 9850 MiB,
    // the catalogue's 9856) ≥ 8000: with HAMi's allowlist the smallest is
    // 2g.10gb, id 14, legal starts {0, 2, 4}, 2 slices.
    // LeastStranded on an empty GPU over {1g.5gb, 2g.10gb, 3g.20gb, 7g.40gb}:
    // first the free slots some free placement still covers — at 0 or 2 all
    // six others (slot 7 by the 3g at 4), at 4 only 0-3 and 6 (1g.5gb has
    // no start 7) = 5 — then room: at 0 → 1g {2..6}=5 + 2g {2,4}=2 + 3g
    // {4}=1 = 8; at 2 → 5+2+1 = 8: a tie, so start 0.
    for reported in [true, false] {
        let gpus = inventory(vec![
            mig_gpu(0, "A100-40GB", reported),
            mig_gpu(1, "A100-40GB", reported),
        ]);
        let request = ask(2, 8000, 0, ModeRequest::Mig);
        let fitted = fit_empty(&request, &gpus, &hami_a100_config()).expect("fits");
        let devices = mig_devices(&fitted);
        assert_eq!(
            devices,
            [
                mig("GPU-0", "2g.10gb", 14, 0, 2),
                mig("GPU-1", "2g.10gb", 14, 0, 2)
            ],
            "reported profiles: {reported}"
        );
        match &fitted.containers[0].devices[0] {
            DeviceAllocation::Mig {
                memory_mib,
                realized,
                ..
            } => {
                assert_eq!((*memory_mib, realized), (9856, &None));
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn the_default_allowlist_picks_the_smaller_1g_10gb_and_places_it_at_6() {
    // With every plain profile allowed, 1g.10gb (≈ 9.62 GiB, 1 compute slice)
    // comes before 2g.10gb (same memory, 2 slices). LeastStranded over
    // {1g.5gb, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb}, 1g.10gb starts
    // {0,2,4,6}: every start leaves the other six slots coverable, so room
    // decides: at 6 → 1g.5gb {0..5}=6 + 1g.10gb {0,2,4}=3 + 2g {0,2,4}=3 +
    // 3g {0}=1 + 4g {0}=1 = 14; at 0 → 5+3+2+1+0 = 11; at 2 or 4 less than 14.
    let gpus = inventory(vec![
        mig_gpu(0, "A100-40GB", true),
        mig_gpu(1, "A100-40GB", true),
    ]);
    let request = ask(2, 8000, 0, ModeRequest::Mig);
    let fitted = fit_empty(&request, &gpus, &ClusterConfig::default()).expect("fits");
    let devices = mig_devices(&fitted);
    assert_eq!(
        devices,
        [
            mig("GPU-0", "1g.10gb", 15, 6, 2),
            mig("GPU-1", "1g.10gb", 15, 6, 2)
        ]
    );
}

#[test]
fn the_unified_pool_lands_on_either_kind() {
    // GPU 0 shares, GPU 1 is an A100-40GB in MIG mode (default allowlist).
    // 8000 MiB: on GPU 0 the slice leaves it 8000/40960 ≈ 0.20 full; on GPU 1
    // a 1g.10gb at 6 leaves room 14 of 18 (7+4+3+2+1+1), 4/18 ≈ 0.22 full.
    let gpus = inventory(vec![
        share_gpu(0, "A100-40GB"),
        mig_gpu(1, "A100-40GB", true),
    ]);
    let config = ClusterConfig::default();
    let mut request = ask(1, 8000, 0, ModeRequest::Any);
    request.gpu_policy = Some(Policy::Spread);
    let fitted = fit_empty(&request, &gpus, &config).expect("fits");
    assert_eq!(fitted.containers[0].devices, [share("GPU-0", 8000, 0)]);
    request.gpu_policy = Some(Policy::Binpack);
    let fitted = fit_empty(&request, &gpus, &config).expect("fits");
    assert_eq!(
        mig_device(&fitted.containers[0].devices[0]),
        mig("GPU-1", "1g.10gb", 15, 6, 2)
    );
    // With the share GPU full, spread lands on the MIG GPU too.
    let full = held("hog", vec![share("GPU-0", 40000, 0)]);
    request.gpu_policy = Some(Policy::Spread);
    let usage = NodeUsage::from_allocations([&full]);
    let fitted = try_fit(&request, &gpus, &usage, &settings(), &config).expect("fits");
    assert_eq!(fitted.containers[0].devices[0].uuid(), "GPU-1");
}

#[test]
fn a_mixed_node_serves_each_mode_from_its_own_gpus() {
    let gpus = inventory(vec![
        share_gpu(0, "H100-80GB"),
        mig_gpu(1, "H100-80GB", true),
        mig_gpu(2, "A30", false),
    ]);
    let config = ClusterConfig::default();
    let share_pod = ask(1, 20000, 50, ModeRequest::Share);
    let fitted = fit_empty(&share_pod, &gpus, &config).expect("fits");
    assert_eq!(fitted.containers[0].devices, [share("GPU-0", 20000, 50)]);
    // 11000 MiB as MIG, both MIG GPUs: the A30's 2g.12gb (11968 MiB) and the
    // H100's 1g.20gb (19968 MiB; 1g.10gb is 9984 < 11000) both fit.
    let mig_pod = ask(2, 11000, 0, ModeRequest::Mig);
    let fitted = fit_empty(&mig_pod, &gpus, &config).expect("fits");
    let mut got: Vec<(String, String)> = fitted.containers[0]
        .devices
        .iter()
        .map(mig_device)
        .map(|(uuid, profile, ..)| (uuid, profile))
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            ("GPU-1".to_owned(), "1g.20gb".to_owned()),
            ("GPU-2".to_owned(), "2g.12gb".to_owned())
        ]
    );
    // Three MIG devices: only two MIG GPUs.
    let three = ask(3, 1000, 0, ModeRequest::Mig);
    assert_eq!(
        fit_empty(&three, &gpus, &config)
            .expect_err("two MIG GPUs")
            .reason,
        "node has 2 usable GPUs (of 3), pod asks for 3 per container"
    );
}

// ---------------------------------------------------------------- reasons

fn reason(
    request: &PodRequest,
    gpus: &NodeGpus,
    usage: &NodeUsage,
    config: &ClusterConfig,
) -> String {
    try_fit(request, gpus, usage, &settings(), config)
        .expect_err("does not fit")
        .reason
}

#[test]
fn reasons_name_what_to_change() {
    let config = ClusterConfig::default();
    let none = NodeUsage::default();
    // A30: the largest profile is 4g.24gb, 24192 MiB.
    let a30 = inventory(vec![mig_gpu(0, "A30", true)]);
    let big = ask(1, 30000, 0, ModeRequest::Mig);
    assert_eq!(
        reason(&big, &a30, &none, &config),
        "no allowed MIG profile ≥ 30000 MiB on NVIDIA A30"
    );
    // One 1g at slot 1 and one at 5: six slots free, yet 3g.20gb's two
    // placements {0-3} and {4-7} both hold an instance.
    let a100 = inventory(vec![mig_gpu(0, "A100-40GB", true)]);
    let scattered = held(
        "small",
        [1, 5]
            .map(|start| mig_held("GPU-0", "1g.5gb", 19, Placement { start, size: 1 }, 4864))
            .to_vec(),
    );
    let usage = NodeUsage::from_allocations([&scattered]);
    let half = ask(1, 15000, 0, ModeRequest::Mig);
    assert_eq!(
        reason(&half, &a100, &usage, &hami_a100_config()),
        "placements free but fragmented: 3g.20gb needs slots 0-3 or 4-7"
    );
    // Type filter.
    let mut h100 = ask(1, 1000, 0, ModeRequest::Any);
    h100.use_types = vec!["H100".into()];
    assert_eq!(
        reason(&h100, &a100, &none, &config),
        "no GPU of type H100 (use-gputype)"
    );
    // Split count: ten slices held on each of two GPUs.
    let shares = inventory(vec![share_gpu(0, "A100-40GB"), share_gpu(1, "A100-40GB")]);
    let slices = Allocation {
        version: 1,
        node: "node-1".into(),
        containers: (0..10)
            .map(|i| tessera_model::sched::allocation::ContainerAllocation {
                index: i,
                name: format!("c{i}"),
                init: false,
                devices: vec![share("GPU-0", 100, 0), share("GPU-1", 100, 0)],
            })
            .collect(),
    };
    let small = ask(1, 100, 0, ModeRequest::Any);
    let split = NodeUsage::from_allocations([&slices]);
    assert_eq!(
        reason(&small, &shares, &split, &config),
        "GPU split count reached (10 slices) on every GPU"
    );
    let three = ask(3, 100, 0, ModeRequest::Any);
    assert_eq!(
        reason(&three, &shares, &none, &config),
        "node has 2 GPUs, pod asks for 3 per container"
    );
    assert_eq!(
        reason(&small, &inventory(vec![]), &none, &config),
        "node inventory lists no GPU"
    );
    // Exclusive: a GPU with a slice cannot take gpucores 100.
    let one = inventory(vec![share_gpu(0, "A30")]);
    let slice = held("a", vec![share("GPU-0", 1000, 10)]);
    let sliced = NodeUsage::from_allocations([&slice]);
    let exclusive = ask(1, 1000, 100, ModeRequest::Any);
    assert_eq!(
        reason(&exclusive, &one, &sliced, &config),
        "GPU 0: gpucores 100 needs a GPU with no slice, it has 1"
    );
    // Modes.
    let mig_only = ask(1, 100, 0, ModeRequest::Mig);
    assert_eq!(
        reason(&mig_only, &shares, &none, &config),
        "pod asks for MIG instances (vgpu-mode: mig) but no GPU is in MIG mode"
    );
    // A MIG GPU the allowlist does not cover.
    let mut narrow = hami_a100_config();
    narrow.nvidia.mig_profile_allowlist[0].models = vec!["H100".into()];
    assert_eq!(
        reason(&mig_only, &a100, &none, &narrow),
        "no migProfileAllowlist entry matches NVIDIA A100-SXM4-40GB"
    );
}

#[test]
fn an_init_container_is_fitted_alone_and_counted_at_its_peak() {
    // 40960 MiB GPU: init 30000, main 30000 — not at the same time, so it fits;
    // held afterwards at the peak, 30000, not 60000.
    let gpus = inventory(vec![share_gpu(0, "A100-40GB")]);
    let mut init = container(1, MemoryRequest::Mib(30000), 0);
    init.init = true;
    init.name = "setup".into();
    let mut main = container(1, MemoryRequest::Mib(30000), 0);
    main.index = 1;
    let request = pod(vec![init, main], ModeRequest::Any);
    let fitted = fit_empty(&request, &gpus, &ClusterConfig::default()).expect("fits");
    let usage = NodeUsage::from_allocations([&allocation_for("node-1", &fitted)]);
    assert_eq!(usage.gpus["GPU-0"].memory_mib, 30000);
    assert_eq!(usage.gpus["GPU-0"].slices, 1);
}

#[test]
fn corrupt_reservations_make_a_gpu_take_nothing() {
    // Two reservations overlapping on one GPU (hand-edited annotations):
    // the GPU takes no new instance and the reason says why.
    let gpus = inventory(vec![mig_gpu(0, "A100-40GB", true)]);
    let overlapping: Vec<Allocation> = [0, 2]
        .map(|start| {
            held(
                "x",
                vec![mig_held(
                    "GPU-0",
                    "3g.20gb",
                    9,
                    Placement { start, size: 4 },
                    20096,
                )],
            )
        })
        .to_vec();
    let usage = NodeUsage::from_allocations(&overlapping);
    let request = ask(1, 100, 0, ModeRequest::Mig);
    let why = reason(&request, &gpus, &usage, &ClusterConfig::default());
    assert!(why.contains("overlaps"), "{why}");
    assert_eq!(usage.occupancy(&gpus.gpus[0]).free_slots(), 0);
}

// ---------------------------------------------------------------- properties

/// The GPU kinds the property tests build nodes from.
#[derive(Debug, Clone)]
enum GpuSpec {
    Share(&'static str),
    Mig(&'static str, bool),
}

fn gpu_spec() -> impl Strategy<Value = GpuSpec> {
    prop_oneof![
        prop::sample::select(vec!["A30", "A100-40GB", "H100-80GB"]).prop_map(GpuSpec::Share),
        (
            prop::sample::select(vec!["A30", "A100-40GB", "H100-94GB", "RTX-PRO-6000"]),
            any::<bool>()
        )
            .prop_map(|(key, reported)| GpuSpec::Mig(key, reported)),
    ]
}

fn memory_request() -> impl Strategy<Value = MemoryRequest> {
    prop_oneof![
        6 => (1u64..12_000).prop_map(MemoryRequest::Mib),
        1 => (1u64..60_000).prop_map(MemoryRequest::Mib),
        1 => (1u32..=100).prop_map(MemoryRequest::Percent),
        1 => Just(MemoryRequest::Whole),
    ]
}

fn container_request() -> impl Strategy<Value = (bool, u32, MemoryRequest, u32)> {
    (
        prop::bool::weighted(0.2),
        prop::sample::select(vec![1u32, 1, 1, 1, 1, 2, 2, 3]),
        memory_request(),
        prop::sample::select(vec![0u32, 0, 0, 0, 10, 30, 50, 100]),
    )
}

fn pod_request() -> impl Strategy<Value = PodRequest> {
    (
        prop::collection::vec(container_request(), 1..=2),
        prop::sample::select(vec![
            ModeRequest::Any,
            ModeRequest::Any,
            ModeRequest::Share,
            ModeRequest::Mig,
        ]),
        prop::sample::select(vec![Policy::Binpack, Policy::Spread]),
    )
        .prop_map(|(asks, mode, policy)| {
            let mut containers: Vec<ContainerRequest> = asks
                .into_iter()
                .map(|(init, count, memory, cores)| ContainerRequest {
                    index: 0,
                    name: String::new(),
                    init,
                    count,
                    memory,
                    cores,
                })
                .collect();
            containers.sort_by_key(|c| !c.init);
            for (i, c) in containers.iter_mut().enumerate() {
                c.index = i as u32;
                c.name = format!("c{i}");
            }
            let mut request = pod(containers, mode);
            request.gpu_policy = Some(policy);
            request
        })
}

#[derive(Debug, Clone)]
enum Op {
    Arrive(PodRequest),
    Release(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => pod_request().prop_map(Op::Arrive),
        1 => any::<usize>().prop_map(Op::Release),
    ]
}

fn node_settings() -> impl Strategy<Value = NodeSettings> {
    (
        1u32..=4,
        prop::sample::select(vec![0.5, 1.0, 1.5]),
        prop::sample::select(vec![1.0, 2.0]),
    )
        .prop_map(|(split, memory, cores)| NodeSettings {
            operating_mode: None,
            split_count: split,
            memory_scaling: memory,
            core_scaling: cores,
            filter: Default::default(),
        })
}

fn build_node(specs: &[GpuSpec], foreign: bool) -> NodeGpus {
    let gpus = specs
        .iter()
        .enumerate()
        .map(|(i, spec)| {
            let index = i as u32;
            match spec {
                GpuSpec::Share(key) => share_gpu(index, key),
                GpuSpec::Mig(key, reported) => {
                    let mut gpu = mig_gpu(index, key, *reported);
                    // An instance made by hand at the axis' last slot(s).
                    if foreign && *reported && i == 0 {
                        let axis = gpu.axis_len();
                        let size = if axis == 12 { 3 } else { 1 };
                        gpu.foreign_instances = vec![Placement {
                            start: axis - size - if axis == 8 { 1 } else { 0 },
                            size,
                        }];
                    }
                    gpu
                }
            }
        })
        .collect();
    inventory(gpus)
}

/// What each GPU holds, worked out here from the allocations alone: per pod
/// the larger of its regular containers together and each init container,
/// field by field; every MIG instance for the pod's life.
#[derive(Default, Debug)]
struct Held {
    memory: u64,
    cores: u64,
    slices: u64,
    exclusive: bool,
    instances: Vec<(u32, Placement)>,
}

fn held_by(allocations: &[Allocation]) -> BTreeMap<String, Held> {
    let mut held: BTreeMap<String, Held> = BTreeMap::new();
    for allocation in allocations {
        let mut phases: Vec<BTreeMap<String, (u64, u64, u64, bool)>> = Vec::new();
        let mut main = BTreeMap::new();
        for c in &allocation.containers {
            let mut alone = BTreeMap::new();
            for d in &c.devices {
                match d {
                    DeviceAllocation::Share {
                        uuid,
                        memory_mib,
                        cores,
                    } => {
                        let target = if c.init { &mut alone } else { &mut main };
                        let e: &mut (u64, u64, u64, bool) = target.entry(uuid.clone()).or_default();
                        e.0 += memory_mib;
                        e.1 += u64::from(*cores);
                        e.2 += 1;
                        e.3 |= *cores == 100;
                    }
                    DeviceAllocation::Mig {
                        uuid,
                        profile_id,
                        placement,
                        ..
                    } => held
                        .entry(uuid.clone())
                        .or_default()
                        .instances
                        .push((*profile_id, *placement)),
                }
            }
            if c.init {
                phases.push(alone);
            }
        }
        phases.push(main);
        let uuids: BTreeSet<String> = phases.iter().flat_map(|p| p.keys().cloned()).collect();
        for uuid in uuids {
            let h = held.entry(uuid.clone()).or_default();
            let peak = |f: fn(&(u64, u64, u64, bool)) -> u64| {
                phases
                    .iter()
                    .filter_map(|p| p.get(&uuid))
                    .map(f)
                    .max()
                    .unwrap_or(0)
            };
            h.memory += peak(|e| e.0);
            h.cores += peak(|e| e.1);
            h.slices += peak(|e| e.2);
            h.exclusive |= phases.iter().filter_map(|p| p.get(&uuid)).any(|e| e.3);
        }
    }
    held
}

fn check_invariants(
    gpus: &NodeGpus,
    settings: &NodeSettings,
    config: &ClusterConfig,
    live: &[(PodRequest, Allocation)],
) -> Result<(), TestCaseError> {
    let allocations: Vec<Allocation> = live.iter().map(|(_, a)| a.clone()).collect();
    for (request, allocation) in live {
        prop_assert!(allocation.validate().is_ok(), "{:?}", allocation.validate());
        prop_assert_eq!(allocation.containers.len(), request.containers.len());
        for (ask, got) in request.containers.iter().zip(&allocation.containers) {
            prop_assert_eq!(got.devices.len(), ask.count as usize);
            let distinct: BTreeSet<&str> = got.devices.iter().map(|d| d.uuid()).collect();
            prop_assert_eq!(
                distinct.len(),
                got.devices.len(),
                "one device per GPU per container"
            );
            for d in &got.devices {
                let gpu = gpus.gpu(d.uuid()).expect("device on a listed GPU");
                prop_assert!(gpu.healthy);
                match d {
                    DeviceAllocation::Share {
                        memory_mib, cores, ..
                    } => {
                        prop_assert!(!gpu.mig, "share slice on a MIG GPU");
                        prop_assert!(request.mode != ModeRequest::Mig);
                        prop_assert_eq!(*cores, ask.cores);
                        if let MemoryRequest::Mib(m) = ask.memory {
                            prop_assert_eq!(*memory_mib, m);
                        }
                    }
                    DeviceAllocation::Mig {
                        profile,
                        memory_mib,
                        ..
                    } => {
                        prop_assert!(gpu.mig, "MIG instance on a share GPU");
                        prop_assert!(request.mode != ModeRequest::Share);
                        if let MemoryRequest::Mib(m) = ask.memory {
                            prop_assert!(*memory_mib >= m, "{} MiB < {} asked", memory_mib, m);
                        }
                        let allowed = config.allowed_profiles(&gpu.model).unwrap_or(&[]);
                        prop_assert!(
                            allowed.iter().any(|a| a == profile),
                            "{} not allowed",
                            profile
                        );
                    }
                }
            }
        }
    }
    let held = held_by(&allocations);
    for gpu in &gpus.gpus {
        let Some(h) = held.get(&gpu.uuid) else {
            continue;
        };
        if gpu.mig {
            prop_assert_eq!(h.slices, 0);
            // Legal placements of the profile (the node's, else the catalogue's).
            let spec = catalogue::find_by_product_name(&gpu.model)
                .and_then(|m| m.mig)
                .expect("known");
            let legal = |id: u32, p: Placement| -> Option<u32> {
                if gpu.mig_profiles.is_empty() {
                    let s = spec.profile_by_id(id)?;
                    s.placements().any(|l| l == p).then_some(s.max_instances)
                } else {
                    let s = gpu.mig_profiles.iter().find(|m| m.id == id)?;
                    s.placements.contains(&p).then_some(s.max_instances)
                }
            };
            let mut used = 0u64;
            for f in &gpu.foreign_instances {
                used |= f.mask();
            }
            let mut per_profile: BTreeMap<u32, u32> = BTreeMap::new();
            for (id, p) in &h.instances {
                let max = legal(*id, *p);
                prop_assert!(
                    max.is_some(),
                    "{p} is not a legal placement of profile {id} on {}",
                    gpu.model
                );
                prop_assert_eq!(used & p.mask(), 0, "{} overlaps another instance", p);
                used |= p.mask();
                let n = per_profile.entry(*id).or_default();
                *n += 1;
                prop_assert!(*n <= max.unwrap_or(0), "instance limit of profile {id}");
            }
        } else {
            prop_assert!(h.instances.is_empty());
            let memory_cap = (gpu.memory_mib as f64 * settings.memory_scaling).floor() as u64;
            let cores_cap = (100.0 * settings.core_scaling).floor() as u64;
            prop_assert!(
                h.memory <= memory_cap,
                "memory {} > {}",
                h.memory,
                memory_cap
            );
            prop_assert!(h.cores <= cores_cap, "cores {} > {}", h.cores, cores_cap);
            prop_assert!(h.slices <= u64::from(settings.split_count));
            if h.exclusive {
                // Only one pod's slice(s): another pod never joins an exclusive GPU.
                let pods = allocations
                    .iter()
                    .filter(|a| a.devices().any(|(_, d)| d.uuid() == gpu.uuid))
                    .count();
                prop_assert_eq!(pods, 1, "exclusive GPU {} shared between pods", gpu.uuid);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn no_sequence_of_binds_and_releases_over_commits(
        specs in prop::collection::vec(gpu_spec(), 1..=4),
        foreign in any::<bool>(),
        settings in node_settings(),
        ops in prop::collection::vec(op(), 1..40),
    ) {
        let gpus = build_node(&specs, foreign);
        let config = ClusterConfig::default();
        let mut live: Vec<(PodRequest, Allocation)> = Vec::new();
        for op in ops {
            match op {
                Op::Arrive(request) => {
                    let allocations: Vec<Allocation> = live.iter().map(|(_, a)| a.clone()).collect();
                    let usage = NodeUsage::from_allocations(&allocations);
                    let first = try_fit(&request, &gpus, &usage, &settings, &config);
                    let again = try_fit(&request, &gpus, &usage, &settings, &config);
                    prop_assert_eq!(&first, &again, "fit is deterministic");
                    match first {
                        Ok(fitted) => {
                            prop_assert!(fitted.score <= 10);
                            live.push((request, allocation_for("node-1", &fitted)));
                        }
                        Err(unfit) => {
                            prop_assert!(!unfit.reason.is_empty());
                            prop_assert!(!unfit.reason.contains('\n'));
                        }
                    }
                }
                Op::Release(k) => {
                    if !live.is_empty() {
                        live.remove(k % live.len());
                    }
                }
            }
            check_invariants(&gpus, &settings, &config, &live)?;
        }
    }

    #[test]
    fn usage_is_the_sum_of_its_allocations_in_any_order(
        specs in prop::collection::vec(gpu_spec(), 1..=3),
        requests in prop::collection::vec(pod_request(), 1..8),
    ) {
        let gpus = build_node(&specs, false);
        let config = ClusterConfig::default();
        let settings = settings();
        let mut allocations = Vec::new();
        let mut usage = NodeUsage::default();
        for request in requests {
            if let Ok(fitted) = try_fit(&request, &gpus, &usage, &settings, &config) {
                let allocation = allocation_for("node-1", &fitted);
                usage.add(&allocation);
                allocations.push(allocation);
            }
        }
        let mut reversed = NodeUsage::from_allocations(allocations.iter().rev());
        for u in reversed.gpus.values_mut() { u.mig.sort(); }
        let mut forward = usage;
        for u in forward.gpus.values_mut() { u.mig.sort(); }
        prop_assert_eq!(forward, reversed);
    }
}
