//! The static spec from `tessera-cdi generate` loads in real podman (which
//! reads `/var/run/cdi`), under both runc and crun: a container sees exactly the
//! device nodes of the device it asked for, with the numbers the node's
//! `/proc` files and state say, and none of the others.

use std::fs;
use std::path::Path;
use std::process::Command;

use tessera_e2e::hookenv;
use tessera_test_support::node::{ExpectedNode, NodeView, SimNode, parse_stat_lines};
use tessera_test_support::podman::{CdiSpecSlot, podman};
use tessera_test_support::rootfs::busybox_rootfs;
use tessera_test_support::{artefact, require, run};

const LIST_NODES: &str =
    "for f in $(find /dev -name 'nvidia*' ! -type d); do stat -c '%n %F %t %T' $f; done";

struct Setup {
    _dir: tempfile::TempDir,
    node: NodeView,
    rootfs: std::path::PathBuf,
    root: std::path::PathBuf,
    _slot: CdiSpecSlot,
}

fn setup() -> Option<Setup> {
    require(&hookenv::needs(&["podman", "runc", "crun"])).ok()?;
    let slot = CdiSpecSlot::acquire().expect("CDI spec slot");
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("node");
    SimNode::profile("demo").at(&root).build().ok()?;
    run(Command::new(artefact("tessera-cdi"))
        .args(["generate", "--driver-root"])
        .arg(&root)
        .arg("--hook-path")
        .arg(tessera_e2e::hookenv::hook_binary())
        .arg("--output")
        .arg(slot.path()))
    .expect("tessera-cdi generate");
    let rootfs = busybox_rootfs(dir.path()).expect("rootfs");
    Some(Setup {
        node: NodeView::read(&root).expect("node view"),
        rootfs,
        root,
        _dir: dir,
        _slot: slot,
    })
}

fn nodes_seen(setup: &Setup, runtime: &str, devices: &[String]) -> Vec<ExpectedNode> {
    let out = run(&mut podman(runtime, devices, &setup.rootfs, LIST_NODES)).expect("podman run");
    parse_stat_lines(&String::from_utf8_lossy(&out.stdout)).expect("stat output")
}

fn sorted(mut nodes: Vec<ExpectedNode>) -> Vec<ExpectedNode> {
    nodes.sort();
    nodes.dedup();
    nodes
}

#[test]
fn containers_see_exactly_the_requested_gpu_and_mig_nodes_under_runc_and_crun() {
    let Some(s) = setup() else { return };
    let control = s.node.control_nodes();
    let migs = s.node.mig_devices();
    assert!(!migs.is_empty(), "the demo node has MIG devices");
    let (mig_gpu, mig_uuid, gi, ci) = migs[0].clone();

    for runtime in ["runc", "crun"] {
        // A whole GPU by index and by uuid: its node and the control nodes.
        let mut want = control.clone();
        want.push(s.node.gpu_node(0));
        let want = sorted(want);
        assert_eq!(
            nodes_seen(&s, runtime, &["0".into()]),
            want,
            "{runtime}: gpu=0"
        );
        assert_eq!(
            nodes_seen(&s, runtime, &[s.node.gpu_uuid(0)]),
            want,
            "{runtime}: gpu=<uuid>"
        );

        // A MIG device brings its parent's node and its two cap nodes, no more.
        let mut want = control.clone();
        want.push(s.node.gpu_node(mig_gpu));
        want.extend(s.node.mig_cap_nodes(mig_gpu, gi, ci));
        let want = sorted(want);
        assert_eq!(
            nodes_seen(&s, runtime, std::slice::from_ref(&mig_uuid)),
            want,
            "{runtime}: MIG device {mig_uuid} (gi {gi}, ci {ci})"
        );

        // `all`: every GPU node without MIG, and every MIG device's nodes.
        let mut want = control.clone();
        want.push(s.node.gpu_node(0));
        for (g, _, gi, ci) in &migs {
            want.push(s.node.gpu_node(*g));
            want.extend(s.node.mig_cap_nodes(*g, *gi, *ci));
        }
        assert_eq!(
            nodes_seen(&s, runtime, &["all".into()]),
            sorted(want),
            "{runtime}: all"
        );

        // No device asked for: no NVIDIA node at all.
        assert_eq!(nodes_seen(&s, runtime, &[]), vec![], "{runtime}: no device");
    }
}

#[test]
fn mig_device_by_index_name_matches_the_same_device_by_uuid() {
    let Some(s) = setup() else { return };
    let spec: serde_json::Value =
        serde_json::from_slice(&fs::read(s._slot.path()).unwrap()).unwrap();
    let devices = spec["devices"].as_array().unwrap();
    let edits_of = |name: &str| {
        devices
            .iter()
            .find(|d| d["name"] == name)
            .unwrap_or_else(|| panic!("spec has no device {name}"))["containerEdits"]
            .clone()
    };
    for (g, uuid, _, _) in s.node.mig_devices() {
        // Find the index name whose edits are this uuid's edits: exactly one.
        let same: Vec<&str> = devices
            .iter()
            .filter_map(|d| d["name"].as_str())
            .filter(|n| n.starts_with(&format!("{g}:")) && edits_of(n) == edits_of(&uuid))
            .collect();
        assert_eq!(
            same.len(),
            1,
            "{uuid}: index names with its edits: {same:?}"
        );
        let by_index = nodes_seen(&s, "runc", &[same[0].to_owned()]);
        let by_uuid = nodes_seen(&s, "runc", std::slice::from_ref(&uuid));
        assert_eq!(by_index, by_uuid, "{} vs {uuid}", same[0]);
    }
}

#[test]
fn granted_nodes_pass_the_device_cgroup_and_driver_files_are_read_only() {
    let Some(s) = setup() else { return };
    // Opening a granted stand-in node fails with ENXIO (no driver behind it),
    // not EPERM: the device cgroup lets it through.
    let script = "cat /dev/nvidia0 2>&1; cat /usr/lib/x86_64-linux-gnu/libcuda.so.1 | head -c 64; \
                  echo; touch /usr/lib/x86_64-linux-gnu/libcuda.so.1 2>&1 || echo WRITE-REFUSED";
    let out = run(&mut podman("runc", &["0".to_owned()], &s.rootfs, script)).expect("podman run");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("No such device or address"),
        "opening /dev/nvidia0 should reach the (absent) driver: {text}"
    );
    let host_lib = fs::read(s.root.join("usr/lib/x86_64-linux-gnu/libcuda.so.1")).unwrap();
    let head = String::from_utf8_lossy(&host_lib[..host_lib.len().min(64)]).into_owned();
    assert!(
        text.contains(head.trim()),
        "library content not the host's: {text}"
    );
    assert!(
        text.contains("WRITE-REFUSED"),
        "library mount is writable: {text}"
    );
    assert!(Path::new(&s.rootfs).join("bin/busybox").exists());
}
