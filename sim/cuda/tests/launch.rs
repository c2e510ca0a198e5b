//! The launch model: work by the cost model (linear in thread blocks by
//! default), queued on the device's timeline that every process of the
//! node shares, as the stand-in itself measures it and as the shared file
//! records it.

mod common;

use common::{Fixture, args};

#[test]
fn each_launch_api_costs_its_blocks() {
    let Some(fx) = Fixture::plain() else {
        return;
    };
    // One round of 4 kernels × 500 blocks × 1000 ns = 2 ms of device time.
    for api in ["launch", "launch_ex", "cooperative", "graph"] {
        let run = fx
            .probe(
                &["launch", "--kernels", "4", "--blocks", "500", "--api", api],
                &[],
            )
            .ok();
        assert_eq!(run.get("kernels_launched"), "4", "{api}");
        assert_eq!(run.get("busy_ns"), "2000000", "{api}");
    }
    let run = fx
        .probe(
            &args("launch --kernels 4 --blocks 500 --api graph"),
            &[("TESSERA_SIM_CUDA_NS_PER_BLOCK", "250")],
        )
        .ok();
    assert_eq!(
        run.get("busy_ns"),
        "500000",
        "the cost per block follows the environment"
    );
    let run = fx
        .probe(
            &args("launch --kernels 4 --blocks 500"),
            &[("TESSERA_SIM_CUDA_NS_PER_BLOCK", "0")],
        )
        .ok();
    assert_eq!(run.get("busy_ns"), "0");
}

#[test]
fn a_saturating_loop_keeps_the_device_busy() {
    let Some(fx) = Fixture::plain() else {
        return;
    };
    // 1 ms kernels, launched as fast as the 5 ms queue lets them in.
    let run = fx
        .probe(&args("launch --kernels 2 --blocks 1000 --seconds 1"), &[])
        .ok();
    let busy = run.num("busy_fraction");
    assert!((0.9..=1.01).contains(&busy), "busy fraction {busy}");
    let rate = run.num("launches_per_sec");
    assert!(
        (800.0..=1100.0).contains(&rate),
        "{rate} launches/s of 1 ms kernels"
    );
}

#[test]
fn sleeps_between_launches_leave_the_device_idle_in_proportion() {
    let Some(fx) = Fixture::plain() else {
        return;
    };
    // 1 ms of work, then 3 ms of sleep: busy about a quarter to a third of the time.
    let run = fx
        .probe(
            &args("launch --kernels 1 --blocks 1000 --seconds 1 --sleep-us 3000"),
            &[],
        )
        .ok();
    let busy = run.num("busy_fraction");
    assert!((0.18..=0.36).contains(&busy), "busy fraction {busy}");
}

#[test]
fn a_cooperative_grid_must_fit_the_device() {
    let Some(fx) = Fixture::plain() else {
        return;
    };
    // 132 SMs × 32 blocks.
    fx.probe(
        &args("launch --kernels 1 --blocks 5000 --api cooperative"),
        &[],
    )
    .failed()
    .naming(&["CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE"]);
}

#[test]
fn bench_reports_nanoseconds_per_call() {
    let Some(fx) = Fixture::plain() else {
        return;
    };
    let run = fx
        .probe(&args("bench --iterations 2000 --rounds 2"), &[])
        .ok();
    for key in [
        "bench.launch_kernel_ns",
        "bench.mem_alloc_free_live1_ns",
        "bench.mem_alloc_free_live1000_ns",
        "bench.mem_get_info_ns",
    ] {
        let ns = run.num(key);
        assert!(ns > 0.0 && ns < 1_000_000.0, "{key}={ns}");
    }
}

#[test]
fn the_cost_model_follows_the_environment() {
    let Some(fx) = Fixture::plain() else {
        return;
    };
    // The default GPU has 132 SMs: waves of 264 blocks at 2 per SM.
    let waves = [
        ("TESSERA_SIM_CUDA_LAUNCH_NS", "5000"),
        ("TESSERA_SIM_CUDA_BLOCKS_PER_SM", "2"),
    ];
    for (blocks, expected) in [("1", 269_000), ("264", 269_000), ("265", 533_000)] {
        let run = fx
            .probe(&["launch", "--kernels", "1", "--blocks", blocks], &waves)
            .ok();
        assert_eq!(run.num("busy_ns"), expected as f64, "{blocks} blocks");
    }
    let noisy = |seed: &str| {
        fx.probe(
            &args("launch --kernels 100 --blocks 100"),
            &[
                ("TESSERA_SIM_CUDA_NOISE_PCT", "10"),
                ("TESSERA_SIM_CUDA_NOISE_SEED", seed),
            ],
        )
        .ok()
        .num("busy_ns")
    };
    let (a, b, c) = (noisy("7"), noisy("7"), noisy("8"));
    assert!((a - 10_000_000.0).abs() <= 1_000_000.0, "{a}");
    assert_ne!(a, 10_000_000.0, "noise changes the cost");
    assert_eq!(a, b, "the same seed, the same costs");
    assert_ne!(a, c, "another seed, other costs");
}

#[test]
fn processes_share_one_device_clock() {
    let Some(fx) = Fixture::node("demo") else {
        return;
    };
    let root = fx.root.clone().expect("a node");
    // Two saturating processes: alone each would keep the device busy.
    let launch = args("launch --kernels 2 --blocks 1000 --seconds 1");
    let children: Vec<_> = (0..2)
        .map(|_| {
            fx.command(&common::probe_exe(), &launch, &[])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn the probe")
        })
        .collect();
    let pids: Vec<u32> = children.iter().map(std::process::Child::id).collect();
    let runs: Vec<_> = children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().expect("wait");
            assert!(out.status.success(), "{out:?}");
            common::parse_lines(&String::from_utf8_lossy(&out.stdout))
        })
        .collect();
    let fraction = |r: &std::collections::BTreeMap<String, String>| -> f64 {
        r["busy_fraction"].parse().expect("busy_fraction")
    };
    let (a, b) = (fraction(&runs[0]), fraction(&runs[1]));
    assert!(
        (0.3..=0.7).contains(&a) && (0.3..=0.7).contains(&b) && (0.9..=1.05).contains(&(a + b)),
        "the two processes share one device: {a} + {b}"
    );
    // The shared file, read from its layout alone, says the same.
    let path = tessera_sim::timeline::path(&root, 0, None);
    let timeline = tessera_sim::timeline::DeviceTimeline::open(&path).expect("the shared timeline");
    let snapshot = timeline.snapshot();
    for (pid, run) in pids.iter().zip(&runs) {
        let recorded = snapshot.processes.get(pid).map_or(0, |p| p.busy_ns);
        assert_eq!(
            recorded.to_string(),
            run["busy_ns"],
            "pid {pid}: the file's record and the process's own count"
        );
    }
    assert_eq!(
        snapshot.device_busy_ns,
        snapshot.busy_of(&pids),
        "the device did nothing else"
    );
}
