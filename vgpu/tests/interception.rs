//! The memory limit through every allocation API and every route into the
//! driver, what programs are told about memory (CUDA and NVML), device
//! reordering, configuration sources and failures, and oversubscription —
//! with `libtessera_vgpu.so` preloaded into the probes on a simulated node.

mod common;

use common::sequences::{
    ALLOC_256, alloc_256, alloc_all_256, assert_granted, demo, demo_with_1_gib, hold_256,
    memory_limits, preloaded,
};
use common::{Limit, MIB, Node, artefacts};

/// Every allocation API the probe has (all but host memory, which no slice
/// counts), and the blocks of 256 MiB that fit in 1 GiB through it.
const APIS: &[(&str, u64)] = &[
    ("mem_alloc", 4),
    ("pitch", 4),
    ("managed", 4),
    ("vmm", 4),
    ("async", 4),
    ("pool_async", 4),
    ("array", 4),
    ("array3d", 4),
    // 256 MiB + a 64 MiB second level: 320 MiB each.
    ("mipmap", 3),
];

#[test]
fn every_allocation_api_stops_at_the_limit_and_gives_it_back() {
    let Some((node, limits)) = demo_with_1_gib() else {
        return;
    };
    for &(api, fit) in APIS {
        let out = node
            .probe(Some(&limits))
            .args(["alloc", "--api", api, "--mib", "256", "--count", "8"])
            .run();
        assert_eq!(
            out.get("result"),
            "CUDA_ERROR_OUT_OF_MEMORY",
            "{api}: {}",
            out.describe()
        );
        assert_eq!(
            out.num("blocks"),
            fit,
            "{api}: blocks within 1 GiB: {}",
            out.describe()
        );
        assert_eq!(
            out.num("mem_total_bytes"),
            1024 * MIB,
            "{api}: {}",
            out.describe()
        );
        assert_eq!(
            out.num("mem_free_after_bytes"),
            1024 * MIB,
            "{api}: every byte is given back by the matching free: {}",
            out.describe()
        );
    }
}

#[test]
fn without_the_library_the_same_allocations_succeed() {
    let Some(node) = demo() else { return };
    alloc_all_256(node.probe(None), 8);
}

#[test]
fn every_route_into_the_driver_stops_at_the_limit() {
    let Some((node, limits)) = demo_with_1_gib() else {
        return;
    };
    // cuGetProcAddress_v2 (a CUDA 12 runtime), cuGetProcAddress asked for
    // an 11.x ABI, and dlsym of versioned names on the dlopen handle.
    for route in [
        vec!["--route", "proc"],
        vec!["--route", "proc", "--cuda-version", "11080"],
        vec!["--route", "dlsym"],
    ] {
        let out = alloc_256(node.probe(Some(&limits)).args(&route), 8);
        assert_eq!(out.num("blocks"), 4, "route {route:?}: {}", out.describe());
        assert_eq!(out.get("result"), "CUDA_ERROR_OUT_OF_MEMORY", "{route:?}");
    }
    // A CUDA 11 runtime: cuGetProcAddress (not _v2), asked for itself too.
    if let Some(program) = node.compile_c("proc_address_v1", "proc_address_v1", &[]) {
        let out = node
            .command(&program, Some(&limits))
            .args(["256", "8"])
            .run();
        out.expect_success();
        assert_eq!(
            out.num("blocks"),
            4,
            "cuGetProcAddress v1: {}",
            out.describe()
        );
        assert_eq!(out.num("result"), 2, "CUDA_ERROR_OUT_OF_MEMORY");
        assert_eq!(out.num("mem_total_bytes"), 1024 * MIB);
    }
    // A program linked against libcuda.so.1: the preloaded exports win.
    let out = node
        .probe_linked(Some(&limits))
        .args(["alloc", "256", "8"])
        .run();
    assert_granted(&out, 4, 1024);
    assert_eq!(out.get("result"), "CUDA_ERROR_OUT_OF_MEMORY");
}

#[test]
fn cuda_reports_the_slice() {
    let Some(node) = demo() else { return };
    let limits = memory_limits(&node, &[1024, 0]);
    let out = node.probe(Some(&limits)).arg("info").run();
    out.expect_success();
    assert_eq!(
        out.num("device.0.total_bytes"),
        1024 * MIB,
        "cuDeviceTotalMem_v2"
    );
    assert_eq!(
        out.num("device.0.mem_total_bytes"),
        1024 * MIB,
        "cuMemGetInfo_v2 total"
    );
    assert_eq!(
        out.num("device.0.mem_free_bytes"),
        1024 * MIB,
        "cuMemGetInfo_v2 free"
    );
    // GPU 1 is listed without a memory limit: the driver's own answer.
    let native = node.probe(None).arg("info").run();
    assert_eq!(
        out.get("device.1.total_bytes"),
        native.get("device.1.total_bytes")
    );
    assert_eq!(
        out.get("device.1.mem_total_bytes"),
        native.get("device.1.mem_total_bytes")
    );
}

#[test]
fn nvml_reports_the_slice_with_the_containers_usage() {
    let Some(node) = demo() else { return };
    let Some(nvml) = node.compile_c("nvml_memory", "nvml_dlsym", &[]) else {
        return;
    };
    let libdir = node.libdir.to_string_lossy().into_owned();
    let Some(linked) = node.compile_c(
        "nvml_memory",
        "nvml_linked",
        &["-DLINKED", "-L", &libdir, "-l:libnvidia-ml.so.1"],
    ) else {
        return;
    };
    let limits = node.gpu0_slice(1024);
    let holder = hold_256(&node, &limits, 2, "30");
    // dlsym on the dlopen handle (pynvml, nvidia-smi), and direct calls.
    for program in [&nvml, &linked] {
        let out = node.command(program, Some(&limits)).run();
        out.expect_success();
        for prefix in ["", "v2_"] {
            let key = |k: &str| format!("device.0.{prefix}{k}");
            assert_eq!(out.num(&key("total")), 1024 * MIB, "{}", out.describe());
            assert_eq!(out.num(&key("used")), 512 * MIB, "{}", out.describe());
            assert_eq!(out.num(&key("free")), 512 * MIB, "{}", out.describe());
        }
        // GPU 1 is not in the file: a file grants no memory on unlisted devices.
        assert_eq!(out.num("device.1.total"), 0, "{}", out.describe());
    }
    drop(holder);
    // Without the library, NVML tells the physical device.
    let native = node.command(&nvml, None).run();
    assert!(
        native.num("device.0.total") > 1024 * MIB,
        "{}",
        native.describe()
    );
}

#[test]
fn reordered_visible_devices_keep_each_gpu_its_own_limit() {
    let Some(node) = demo() else { return };
    assert!(node.uuids.len() >= 2, "the demo node has two GPUs");
    let limits = memory_limits(&node, &[1024, 2048]);
    let alloc = |device: &str| {
        node.probe(Some(&limits))
            .env("CUDA_VISIBLE_DEVICES", "1,0")
            .args(ALLOC_256)
            .args(["16", "--device", device])
            .run()
    };
    // Ordinal 0 is GPU 1 now: 2 GiB.
    assert_granted(&alloc("0"), 8, 2048);
    // Ordinal 1 is GPU 0: 1 GiB.
    assert_granted(&alloc("1"), 4, 1024);
}

#[test]
fn a_mig_device_is_limited_by_its_mig_uuid() {
    let Some(node) = demo() else { return };
    let mig = node
        .mig_uuids
        .last()
        .expect("the demo node has MIG devices")
        .clone();
    let limits = node.limits_by_uuid("vgpu.json", &[(&mig, 1024)]);
    let probe = node.probe(Some(&limits)).env("CUDA_VISIBLE_DEVICES", &mig);
    assert_granted(&alloc_256(probe, 8), 4, 1024);
}

#[test]
fn hami_environment_sets_the_limit_where_there_is_no_file() {
    let Some(node) = demo() else { return };
    // The node side makes the file HAMi's variable names (the library never does).
    let cache = node.accounting.join("hami.cache");
    tessera_vgpu::accounting::create_file(&cache).expect("region file");
    let probe = preloaded(&node)
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "512m")
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", &cache);
    assert_granted(&alloc_256(probe, 4), 2, 512);
    assert!(
        std::fs::metadata(&cache).expect("region").len() > 0,
        "the shared region is where HAMi's variable says"
    );
}

#[test]
fn environment_values_cannot_raise_a_file_limit() {
    let Some((node, limits)) = demo_with_1_gib() else {
        return;
    };
    let probe = node
        .probe(Some(&limits))
        .env("CUDA_DEVICE_MEMORY_LIMIT", "100g")
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "100g");
    assert_granted(&alloc_256(probe, 8), 4, 1024);
}

#[test]
fn without_any_configuration_every_call_passes_through() {
    let Some(node) = demo() else { return };
    let out = alloc_all_256(preloaded(&node), 8);
    assert!(
        out.num("mem_total_bytes") > 1024 * MIB,
        "the physical device: {}",
        out.describe()
    );
    assert!(
        out.library_lines().is_empty(),
        "nothing to say: {}",
        out.describe()
    );
}

#[test]
fn a_malformed_limits_file_fails_closed_with_one_line() {
    let Some(node) = demo() else { return };
    let broken = node.write("broken.json", r#"{"version": 1, "devices": [{"uuid": 7}]}"#);
    let out = node
        .probe(Some(&broken))
        .args(["alloc", "--api", "mem_alloc", "--mib", "1", "--count", "1"])
        .run();
    assert_eq!(
        out.get("result"),
        "CUDA_ERROR_OUT_OF_MEMORY",
        "{}",
        out.describe()
    );
    assert_eq!(out.num("mem_total_bytes"), 0, "no GPU memory is granted");
    let lines = out.library_lines();
    assert_eq!(lines.len(), 1, "one line: {}", out.describe());
    assert!(
        lines[0].contains("broken.json"),
        "it names the file: {}",
        lines[0]
    );
}

#[test]
fn oversubscription_serves_the_rest_of_the_slice_from_host_memory() {
    let Some(node) = demo() else { return };
    let device = [Limit {
        gpu: 0,
        memory_mib: 2048,
        sm_percent: 0,
    }];
    let alloc = |limits: &std::path::Path| {
        // The device physically holds 512 MiB.
        let probe = node
            .probe(Some(limits))
            .env("TESSERA_SIM_CUDA_DEVICE_MEMORY_MIB", "512");
        alloc_256(probe, 12)
    };
    let plain = alloc(&node.limits("plain.json", &device, ""));
    assert_eq!(
        plain.num("blocks"),
        2,
        "the device is full at 512 MiB: {}",
        plain.describe()
    );
    let over = alloc(&node.limits(
        "over.json",
        &device,
        r#""oversubscribe": true, "memoryScaling": 2.0"#,
    ));
    assert_eq!(
        over.num("blocks"),
        8,
        "the whole 2 GiB slice: {}",
        over.describe()
    );
    assert_eq!(
        over.get("result"),
        "CUDA_ERROR_OUT_OF_MEMORY",
        "and not a byte more"
    );
    assert_eq!(
        over.num("mem_free_after_bytes"),
        2048 * MIB,
        "host-backed blocks freed too"
    );
}

#[test]
fn other_interposers_keep_their_rtld_next_lookups() {
    let Some(a) = artefacts() else { return };
    let node = Node::create(a, "h100-80gb");
    let Some(next) = node.compile_c("next_interposer", "libnext.so", &["-shared", "-fPIC"]) else {
        return;
    };
    let Some(main) = node.compile_c("pid_main", "pid_main", &[]) else {
        return;
    };
    // Preloaded after the library: its dlsym(RTLD_NEXT, "getpid") goes
    // through the library's exported dlsym and must still mean "after me".
    let preload = format!("{}:{}", node.a.lib.display(), next.display());
    let out = node.command(&main, None).env("LD_PRELOAD", preload).run();
    out.expect_success();
    assert_eq!(out.get("pid_ok"), "1", "{}", out.describe());
}
