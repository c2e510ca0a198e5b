//! One budget per container: processes share it, a killed process's memory
//! comes back, and a child that lost its environment keeps the limit of the
//! container's limits file.

mod common;

use std::process::Command;

use common::sequences::{alloc_256, alloc_all_256, assert_granted, demo_with_1_gib, hold_256};
use common::{Need, Node, is_root, require};

#[test]
fn two_processes_share_one_budget() {
    let Some((node, limits)) = demo_with_1_gib() else {
        return;
    };
    let first = hold_256(&node, &limits, 3, "30");
    assert_eq!(first.output().get("blocks").map(String::as_str), Some("3"));
    // 768 MiB are taken by the first process: one block left.
    let second = alloc_256(node.probe(Some(&limits)), 3);
    assert_eq!(second.num("blocks"), 1, "{}", second.describe());
    assert_eq!(
        second.num("mem_free_bytes"),
        0,
        "cuMemGetInfo counts both processes"
    );
    drop(first);
    // The first process is gone (killed): its 768 MiB come back.
    let third = alloc_256(node.probe(Some(&limits)), 4);
    assert_eq!(third.num("blocks"), 4, "{}", third.describe());
}

#[test]
fn a_process_that_exits_normally_returns_its_memory() {
    let Some((node, limits)) = demo_with_1_gib() else {
        return;
    };
    let first = hold_256(&node, &limits, 4, "0.2");
    first.wait().expect_success();
    alloc_all_256(node.probe(Some(&limits)), 4);
}

#[test]
fn a_killed_processes_memory_returns_to_the_budget() {
    let Some((node, limits)) = demo_with_1_gib() else {
        return;
    };
    let mut holder = hold_256(&node, &limits, 4, "60");
    // SIGKILL: no free, no exit handler; its charges stay in the region.
    holder.child.kill().expect("kill -9");
    let _ = holder.child.wait();
    // The dead process's 1 GiB was reclaimed.
    alloc_all_256(node.probe(Some(&limits)), 4);
}

/// Runs `script` (sh) as root in a private mount namespace, where
/// `/usr/local` is a fresh tmpfs holding `/usr/local/tessera/vgpu.json`
/// copied from `$LIMITS`. `None` after [`skip`] where that cannot be done.
fn in_container_namespace(
    node: &Node,
    limits: &std::path::Path,
    script: &str,
) -> Option<common::Output> {
    require(&[Need::condition(
        is_root(),
        "root: the container-file test needs a private mount namespace with a tmpfs on /usr/local",
        "run as root",
    )])
    .ok()?;
    let probe = Command::new("unshare")
        .args(["-m", "--propagation", "private", "true"])
        .output();
    let works = probe.as_ref().is_ok_and(|o| o.status.success());
    let why = probe.map_or_else(
        |e| e.to_string(),
        |o| String::from_utf8_lossy(&o.stderr).trim().to_owned(),
    );
    require(&[Need::condition(
        works,
        format!("unshare -m working ({why})"),
        "install util-linux or run with CAP_SYS_ADMIN",
    )])
    .ok()?;
    let setup = "set -e; mount -t tmpfs tessera-test /usr/local; mkdir -p /usr/local/tessera; \
                 cp \"$LIMITS\" /usr/local/tessera/vgpu.json; ";
    let out = node
        .command(std::path::Path::new("unshare"), None)
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(format!("{setup}{script}"))
        .env("LIMITS", limits)
        .env("PROBE", &node.a.probe)
        .env("LIB", &node.a.lib)
        .env("LIBDIR", &node.libdir)
        .run();
    Some(out)
}

#[test]
fn a_child_started_with_env_i_keeps_the_container_files_limit() {
    let Some((node, limits)) = demo_with_1_gib() else {
        return;
    };
    // `env -i` drops everything; the loader still needs the preload and the
    // node's libcuda (on a real node: /etc/ld.so.preload and the system
    // library path); the limits come from the file alone. A HAMi variable
    // asking for more is ignored where the file exists.
    let script = "exec env -i LD_PRELOAD=\"$LIB\" LD_LIBRARY_PATH=\"$LIBDIR\" \
                  CUDA_DEVICE_MEMORY_LIMIT=100g \
                  \"$PROBE\" alloc --api mem_alloc --mib 256 --count 8";
    let Some(out) = in_container_namespace(&node, &limits, script) else {
        return;
    };
    assert_granted(&out, 4, 1024);
    assert!(
        !std::path::Path::new("/usr/local/tessera/vgpu.json").exists(),
        "the test's file stayed in its namespace"
    );
}
