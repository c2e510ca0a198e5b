//! The launch model: work proportional to thread blocks, queued on the
//! device's timeline, as the stand-in itself measures it.

mod common;

use common::Fixture;

#[test]
fn each_launch_api_costs_its_blocks() {
    let Some(fx) = Fixture::plain("each_launch_api_costs_its_blocks") else {
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
            &[
                "launch",
                "--kernels",
                "4",
                "--blocks",
                "500",
                "--api",
                "graph",
            ],
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
            &["launch", "--kernels", "4", "--blocks", "500"],
            &[("TESSERA_SIM_CUDA_NS_PER_BLOCK", "0")],
        )
        .ok();
    assert_eq!(run.get("busy_ns"), "0");
}

#[test]
fn a_saturating_loop_keeps_the_device_busy() {
    let Some(fx) = Fixture::plain("a_saturating_loop_keeps_the_device_busy") else {
        return;
    };
    // 1 ms kernels, launched as fast as the 5 ms queue lets them in.
    let run = fx
        .probe(
            &[
                "launch",
                "--kernels",
                "2",
                "--blocks",
                "1000",
                "--seconds",
                "1",
            ],
            &[],
        )
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
    let Some(fx) = Fixture::plain("sleeps_between_launches_leave_the_device_idle_in_proportion")
    else {
        return;
    };
    // 1 ms of work, then 3 ms of sleep: busy about a quarter to a third of the time.
    let run = fx
        .probe(
            &[
                "launch",
                "--kernels",
                "1",
                "--blocks",
                "1000",
                "--seconds",
                "1",
                "--sleep-us",
                "3000",
            ],
            &[],
        )
        .ok();
    let busy = run.num("busy_fraction");
    assert!((0.18..=0.36).contains(&busy), "busy fraction {busy}");
}

#[test]
fn a_cooperative_grid_must_fit_the_device() {
    let Some(fx) = Fixture::plain("a_cooperative_grid_must_fit_the_device") else {
        return;
    };
    // 132 SMs × 32 blocks.
    let run = fx
        .probe(
            &[
                "launch",
                "--kernels",
                "1",
                "--blocks",
                "5000",
                "--api",
                "cooperative",
            ],
            &[],
        )
        .failed();
    assert!(
        run.stderr
            .contains("CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE"),
        "{}",
        run.stderr
    );
}

#[test]
fn bench_reports_nanoseconds_per_call() {
    let Some(fx) = Fixture::plain("bench_reports_nanoseconds_per_call") else {
        return;
    };
    let run = fx
        .probe(&["bench", "--iterations", "2000", "--rounds", "2"], &[])
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
