//! What the interception tests run again and again: the allocation most of
//! them make, the demo node with a 1 GiB slice, limits files of memory
//! limits alone, and the check of what a probe was granted.

use std::path::{Path, PathBuf};

use super::{Holding, Limit, MIB, Node, Output, Probe, artefacts};

/// `tessera-cuda-probe alloc` of 256 MiB blocks with `cuMemAlloc_v2`; the
/// number of blocks follows.
pub const ALLOC_256: [&str; 6] = ["alloc", "--api", "mem_alloc", "--mib", "256", "--count"];

/// Runs `probe` allocating `blocks` 256 MiB blocks.
pub fn alloc_256(probe: Probe, blocks: u64) -> Output {
    probe.args(ALLOC_256).arg(blocks.to_string()).run()
}

/// [`alloc_256`], asserting that the probe succeeded and got every block.
pub fn alloc_all_256(probe: Probe, blocks: u64) -> Output {
    let out = alloc_256(probe, blocks);
    out.expect_success();
    assert_eq!(out.num("blocks"), blocks, "{}", out.describe());
    out
}

/// A probe holding `blocks` 256 MiB blocks under `limits` for `secs`
/// seconds, once it holds them.
pub fn hold_256(node: &Node, limits: &Path, blocks: u64, secs: &str) -> Holding {
    node.probe(Some(limits))
        .args(ALLOC_256)
        .args([&blocks.to_string(), "--hold-secs", secs])
        .start_holding()
}

/// `tessera-cuda-probe` with the library preloaded but no limits file
/// named: what the environment (or the container file) says applies.
pub fn preloaded(node: &Node) -> Probe {
    node.command(&node.a.probe, None)
        .env("LD_PRELOAD", &node.a.lib)
}

/// The demo node (two GPUs and MIG devices); `None` after a skip.
pub fn demo() -> Option<Node> {
    Some(Node::create(artefacts()?, "demo"))
}

/// The demo node and its `vgpu.json` with a 1 GiB slice of GPU 0; `None`
/// after a skip.
pub fn demo_with_1_gib() -> Option<(Node, PathBuf)> {
    let node = demo()?;
    let limits = node.gpu0_slice(1024);
    Some((node, limits))
}

/// Writes `vgpu.json` with a memory limit of `mib[i]` MiB on GPU `i` (0:
/// listed without one), no SM limits, and returns its path.
pub fn memory_limits(node: &Node, mib: &[u64]) -> PathBuf {
    let devices: Vec<Limit> = mib
        .iter()
        .enumerate()
        .map(|(gpu, &memory_mib)| Limit {
            gpu,
            memory_mib,
            sm_percent: 0,
        })
        .collect();
    node.limits("vgpu.json", &devices, "")
}

/// Asserts that an `alloc` probe got `blocks` blocks and was told its
/// device holds `total_mib` MiB (`cuMemGetInfo`).
pub fn assert_granted(out: &Output, blocks: u64, total_mib: u64) {
    assert_eq!(out.num("blocks"), blocks, "blocks: {}", out.describe());
    assert_eq!(
        out.num("mem_total_bytes"),
        total_mib * MIB,
        "total: {}",
        out.describe()
    );
}
