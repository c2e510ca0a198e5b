//! One budget per container: processes share it, a killed process's memory
//! comes back, and a child that lost its environment keeps the limit of the
//! container's limits file.

mod common;

use std::process::Command;

use common::{MIB, Node, artefacts, skip};

fn one_gib(node: &Node) -> std::path::PathBuf {
    node.gpu0_slice(1024)
}

const ALLOC_256: [&str; 6] = ["alloc", "--api", "mem_alloc", "--mib", "256", "--count"];

#[test]
fn two_processes_share_one_budget() {
    let Some(a) = artefacts() else { return };
    let node = Node::create(a, "demo");
    let limits = one_gib(&node);
    let first = node
        .probe(Some(&limits))
        .args(ALLOC_256)
        .args(["3", "--hold-secs", "30"])
        .start_holding();
    assert_eq!(first.output().get("blocks").map(String::as_str), Some("3"));
    // 768 MiB are taken by the first process: one block left.
    let second = node.probe(Some(&limits)).args(ALLOC_256).arg("3").run();
    assert_eq!(second.num("blocks"), 1, "{}", second.describe());
    assert_eq!(
        second.num("mem_free_bytes"),
        0,
        "cuMemGetInfo counts both processes"
    );
    drop(first);
    // The first process is gone (killed): its 768 MiB come back.
    let third = node.probe(Some(&limits)).args(ALLOC_256).arg("4").run();
    assert_eq!(third.num("blocks"), 4, "{}", third.describe());
}

#[test]
fn a_process_that_exits_normally_returns_its_memory() {
    let Some(a) = artefacts() else { return };
    let node = Node::create(a, "demo");
    let limits = one_gib(&node);
    let first = node
        .probe(Some(&limits))
        .args(ALLOC_256)
        .args(["4", "--hold-secs", "0.2"])
        .start_holding();
    first.wait().expect_success();
    let second = node.probe(Some(&limits)).args(ALLOC_256).arg("4").run();
    second.expect_success();
    assert_eq!(second.num("blocks"), 4);
}

#[test]
fn a_killed_processes_memory_returns_to_the_budget() {
    let Some(a) = artefacts() else { return };
    let node = Node::create(a, "demo");
    let limits = one_gib(&node);
    let mut holder = node
        .probe(Some(&limits))
        .args(ALLOC_256)
        .args(["4", "--hold-secs", "60"])
        .start_holding();
    // SIGKILL: no free, no exit handler; its charges stay in the region.
    holder.child.kill().expect("kill -9");
    let _ = holder.child.wait();
    let out = node.probe(Some(&limits)).args(ALLOC_256).arg("4").run();
    out.expect_success();
    assert_eq!(
        out.num("blocks"),
        4,
        "the dead process's 1 GiB was reclaimed: {}",
        out.describe()
    );
}

/// Runs `script` (sh) as root in a private mount namespace, where
/// `/usr/local` is a fresh tmpfs holding `/usr/local/tessera/vgpu.json`
/// copied from `$LIMITS`. `None` after [`skip`] where that cannot be done.
fn in_container_namespace(
    node: &Node,
    limits: &std::path::Path,
    script: &str,
) -> Option<common::Output> {
    if !common::is_root() {
        skip(
            "the container-file test needs root (a private mount namespace with a tmpfs on /usr/local)",
        );
        return None;
    }
    let probe = Command::new("unshare")
        .args(["-m", "--propagation", "private", "true"])
        .output();
    if !probe.as_ref().is_ok_and(|o| o.status.success()) {
        skip(&format!(
            "unshare -m does not work here ({}); install util-linux or run with CAP_SYS_ADMIN",
            probe.map_or_else(
                |e| e.to_string(),
                |o| String::from_utf8_lossy(&o.stderr).into_owned()
            )
        ));
        return None;
    }
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
    let Some(a) = artefacts() else { return };
    let node = Node::create(a, "demo");
    let limits = one_gib(&node);
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
    assert_eq!(out.num("blocks"), 4, "{}", out.describe());
    assert_eq!(out.num("mem_total_bytes"), 1024 * MIB, "{}", out.describe());
    assert!(
        !std::path::Path::new("/usr/local/tessera/vgpu.json").exists(),
        "the test's file stayed in its namespace"
    );
}
