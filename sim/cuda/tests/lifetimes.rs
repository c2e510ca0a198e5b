//! Memory lifetimes as the real driver keeps them, which the vGPU library
//! must follow: VMM memory while a handle reference or a mapping remains,
//! pools that keep what they free down to their release threshold, context
//! teardown, each context's own memory and malloc heap. Every check reads
//! `cuMemGetInfo` (this process's view of its device) after a step of a
//! `tessera-cuda-probe script`.

mod common;

use common::{Fixture, MIB, Run};

/// 64 GiB devices; used = total − free.
const TOTAL: (&str, &str) = ("TESSERA_SIM_CUDA_DEVICE_MEMORY_MIB", "65536");

/// MiB in use after each `info` step, in order.
fn used_mib(run: &Run) -> Vec<u64> {
    let mut labels: Vec<(usize, u64)> = run
        .values
        .iter()
        .filter_map(|(k, v)| {
            let n: usize = k.strip_prefix('i')?.strip_suffix(".free")?.parse().ok()?;
            let free: u64 = v.parse().ok()?;
            Some((n, 65536 - free / MIB))
        })
        .collect();
    labels.sort();
    labels.into_iter().map(|(_, used)| used).collect()
}

fn script(fx: &Fixture, steps: &[&str], envs: &[(&str, &str)]) -> Run {
    let mut args = vec!["script"];
    args.extend_from_slice(steps);
    let mut all = vec![TOTAL];
    all.extend_from_slice(envs);
    let run = fx.probe(&args, &all).ok();
    assert!(
        !run.stdout
            .lines()
            .any(|l| l.starts_with("step.") && !l.ends_with("CUDA_SUCCESS")),
        "every step succeeds: {}",
        run.stdout
    );
    run
}

#[test]
fn vmm_memory_lives_while_a_reference_or_a_mapping_does() {
    let Some(fx) = Fixture::plain() else {
        return;
    };
    let run = script(
        &fx,
        &[
            "retain 0",
            "vmm h 1024 0",
            "reserve va 1024",
            "map va h",
            "release-handle h",
            "info i0",
            "retain-handle again va",
            "unmap va",
            "info i1",
            "export fd again",
            "import mine fd",
            "release-handle again",
            "info i2",
            "release-handle mine",
            "info i3",
        ],
        &[],
    );
    assert_eq!(used_mib(&run), [1024, 1024, 1024, 0], "{}", run.stdout);
}

#[test]
fn a_pool_keeps_what_it_frees_down_to_its_release_threshold() {
    let Some(fx) = Fixture::plain() else {
        return;
    };
    let run = script(
        &fx,
        &[
            "retain 0",
            "async a 101 null",
            "info i0",
            "free-async a null",
            "info i1",
            "sync",
            "info i2",
            "pool-threshold 0 max",
            "async b 300 null",
            "free-async b null",
            "sync",
            "info i3",
            "async c 200 null",
            "info i4",
            "free-async c null",
            "pool-trim 0 100",
            "info i5",
            "pool-reserved reserved 0",
        ],
        &[],
    );
    // 101 MiB reserve 102 (2 MiB granules); freed, kept until the sync;
    // UINT64_MAX keeps 300 past a sync, serves 200 from it, trims to 100.
    assert_eq!(
        used_mib(&run),
        [102, 102, 0, 300, 300, 100],
        "{}",
        run.stdout
    );
    assert_eq!(run.get("reserved"), (100 * MIB).to_string());
}

#[test]
fn a_context_takes_its_memory_with_it() {
    let Some(fx) = Fixture::plain() else {
        return;
    };
    let context = [("TESSERA_SIM_CUDA_CONTEXT_MIB", "300")];
    let run = script(
        &fx,
        &[
            "retain 0",
            "info i0",
            "ctx-create c 0",
            "alloc a 100",
            "heap 50",
            "info i1",
            "ctx-destroy c",
            "info i2",
            "alloc b 100",
            "async p 10 null",
            "reset 0",
            "info i3",
            "release 0",
            "info i4",
        ],
        &context,
    );
    // Own memory 300 per context; destroy takes 300 + 100 + 50; reset takes
    // the primary context's allocation and the pool's reserve, not the
    // context itself; the last release takes the context.
    assert_eq!(used_mib(&run), [300, 750, 300, 300, 0], "{}", run.stdout);
}
