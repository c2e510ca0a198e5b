//! Device memory: every allocation API is charged and refused past the
//! capacity; managed and host memory are not charged.

mod common;

use common::{Fixture, MIB, args};

/// 64 MiB devices; five blocks of 16 MiB.
const SMALL: (&str, &str) = ("TESSERA_SIM_CUDA_DEVICE_MEMORY_MIB", "64");

#[test]
fn every_device_allocation_api_runs_out_at_the_capacity() {
    let Some(fx) = Fixture::plain() else {
        return;
    };
    // (api, blocks that fit): a mipmap of 16 MiB base and 2 levels takes 20 MiB.
    let apis = [
        ("mem_alloc", 4),
        ("pitch", 4),
        ("vmm", 4),
        ("async", 4),
        ("pool_async", 4),
        ("array", 4),
        ("array3d", 4),
        ("mipmap", 3),
    ];
    for (api, fit) in apis {
        let run = fx
            .probe(
                &["alloc", "--api", api, "--mib", "16", "--count", "5"],
                &[SMALL],
            )
            .failed()
            .naming(&["CUDA_ERROR_OUT_OF_MEMORY"]);
        assert_eq!(run.get("result"), "CUDA_ERROR_OUT_OF_MEMORY", "{api}");
        assert_eq!(run.get("blocks"), fit.to_string(), "{api}");
        let charged = 64 * MIB - run.num("mem_free_bytes") as u64;
        assert_eq!(
            charged,
            run.num("allocated_bytes") as u64,
            "{api}: charged what it got"
        );
        assert_eq!(
            run.num("mem_free_after_bytes") as u64,
            64 * MIB,
            "{api}: all returned"
        );
    }
}

#[test]
fn managed_and_host_memory_are_not_device_memory() {
    let Some(fx) = Fixture::plain() else {
        return;
    };
    for api in ["managed", "host"] {
        let run = fx
            .probe(
                &["alloc", "--api", api, "--mib", "16", "--count", "5"],
                &[SMALL],
            )
            .ok();
        assert_eq!(run.get("result"), "CUDA_SUCCESS", "{api}");
        assert_eq!(run.get("blocks"), "5", "{api}");
        assert_eq!(run.num("mem_free_bytes") as u64, 64 * MIB, "{api}");
    }
    // Managed memory past a full device still succeeds: the fallback a
    // vGPU layer uses when the device is full.
    let run = fx
        .probe(&args("alloc --api managed --mib 1024 --count 2"), &[SMALL])
        .ok();
    assert_eq!(run.get("allocated_mib"), "2048");
}

#[test]
fn the_dlsym_route_reaches_the_same_allocator() {
    let Some(fx) = Fixture::plain() else {
        return;
    };
    for api in ["mem_alloc", "vmm", "pool_async"] {
        let run = fx
            .probe(
                &[
                    "--route", "dlsym", "alloc", "--api", api, "--mib", "16", "--count", "5",
                ],
                &[SMALL],
            )
            .failed();
        assert_eq!(run.get("blocks"), "4", "{api}");
        assert_eq!(run.get("result"), "CUDA_ERROR_OUT_OF_MEMORY", "{api}");
    }
}

#[test]
fn allocations_are_held_until_freed_and_counted_per_device() {
    let Some(fx) = Fixture::node("demo") else {
        return;
    };
    let run = fx
        .probe(
            &args("alloc --api mem_alloc --mib 1000 --count 3 --device 1 --hold-secs 0.1"),
            &[],
        )
        .ok();
    assert_eq!(run.get("state"), "holding");
    assert_eq!(
        run.num("mem_total_bytes") as u64,
        40960 * MIB,
        "device 1 is the A100"
    );
    assert_eq!(run.num("mem_free_bytes") as u64, (40960 - 3000) * MIB);
    assert_eq!(run.num("mem_free_after_bytes") as u64, 40960 * MIB);
}
