//! Binding records when the runtime applied the spec (CDI): the hook records
//! container id, init pid and cgroup under <state_dir>/alloc/<id>/ and removes
//! the record at poststop only for the same container.

mod common;

use std::fs;

use common::{Fixture, Need, alloc_spec, code_and_stderr, config_json, require};
use serde_json::{Value, json};

fn cdi_config(alloc: &str) -> Value {
    // What a CDI runtime leaves in config.json: the spec's nodes and env.
    let mut c = config_json(
        json!({}),
        &[
            &format!("TESSERA_ALLOC_ID={alloc}"),
            "NVIDIA_VISIBLE_DEVICES=void",
        ],
    );
    c["process"]["user"] = json!({"uid": 1234, "gid": 4321});
    c["linux"]["devices"] = json!([
        {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255},
        {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0},
        {"path": "/dev/nvidia-caps/nvidia-cap12", "type": "c", "major": 195, "minor": 12}
    ]);
    c
}

/// A fixture whose container config shows the transient spec of `alloc` applied.
fn applied(alloc: &str) -> Fixture {
    let fx = Fixture::new();
    fx.write_spec(
        &format!("tessera.io-alloc_{alloc}.json"),
        &alloc_spec(alloc, json!([])),
    );
    fx.write_config(&cdi_config(alloc));
    fx
}

#[test]
fn applied_spec_is_bound_and_unbound() {
    require!(Need::Root);
    let alloc = "3f2b7c1a-9d4e-4f6a-8b1c-2d3e4f5a6b7c-0";
    let fx = applied(alloc);
    // A stand-in init in its own mount and pid namespaces runs the hook, as
    // runc runs a createContainer hook; the state says pid 1.
    let (out, pid) = fx.run_inside("prestart", "ctr-1", Some(1));
    assert_eq!(code_and_stderr(&out), (0, String::new()));

    let path = fx.path(&format!("state/alloc/{alloc}/binding.json"));
    let b: Value = serde_json::from_slice(&fs::read(&path).expect("binding.json")).expect("json");
    assert_eq!(b["allocId"], alloc);
    assert_eq!(b["containerId"], "ctr-1");
    assert_eq!(b["pid"].as_u64(), Some(u64::from(pid)));
    assert_eq!(b["mode"], "cdi");
    assert_eq!(b["bundle"], fx.path("bundle").to_str().expect("utf-8"));
    let own_cgroup = fs::read_to_string("/proc/self/cgroup").expect("cgroup");
    assert!(
        own_cgroup.contains(b["cgroup"].as_str().expect("cgroup")),
        "{b}"
    );
    use std::os::unix::fs::MetadataExt;
    let dir = fs::metadata(fx.path(&format!("state/alloc/{alloc}"))).expect("alloc dir");
    assert_eq!((dir.uid(), dir.mode() & 0o7777), (0, 0o700));
    let acct =
        fs::metadata(fx.path(&format!("state/alloc/{alloc}/accounting"))).expect("accounting");
    assert_eq!(
        (acct.uid(), acct.gid(), acct.mode() & 0o7777),
        (0, 0, 0o755),
        "the workload (uid 1234) cannot unlink or replace what is in it"
    );
    let region =
        fs::symlink_metadata(fx.path(&format!("state/alloc/{alloc}/accounting/vgpu.accounting")))
            .expect("region file");
    assert!(region.file_type().is_file());
    assert_eq!(
        (region.uid(), region.len(), region.mode() & 0o7777),
        (0, 0, 0o666),
        "empty, root's, usable by every uid of the container"
    );
    let file = fs::metadata(&path).expect("binding");
    assert_eq!(file.mode() & 0o7777, 0o644);

    // Idempotent: a second hook point writes the same record again (crun
    // passes no pid at createContainer).
    assert_eq!(
        code_and_stderr(&fx.run_inside("prestart", "ctr-1", None).0).0,
        0
    );
    assert!(path.exists());
    // poststop of another container leaves the record; of this one removes it.
    assert_eq!(
        code_and_stderr(&fx.run("poststop", &fx.state("ctr-other", None))).0,
        0
    );
    assert!(
        path.exists(),
        "another container's poststop must not unbind"
    );
    assert_eq!(
        code_and_stderr(&fx.run("poststop", &fx.state("ctr-1", None))).0,
        0
    );
    assert!(!path.exists(), "poststop removes the record");
    assert!(
        fx.path(&format!("state/alloc/{alloc}/accounting")).is_dir(),
        "accounting stays"
    );
    // A second poststop finds nothing and succeeds.
    assert_eq!(
        code_and_stderr(&fx.run("poststop", &fx.state("ctr-1", None))).0,
        0
    );
}

#[test]
fn the_test_process_is_no_container_init() {
    require!(Need::Root);
    // What the hook used to accept: any live host pid in the state. The test
    // process is neither in the container's namespaces nor started by the
    // process running the hook.
    let alloc = "pod-0";
    let fx = applied(alloc);
    for pid in [std::process::id(), 2] {
        let (code, stderr) = code_and_stderr(&fx.run("prestart", &fx.state("ctr-1", Some(pid))));
        assert_eq!(code, 4, "{stderr}");
        assert!(
            stderr.contains(&format!("pid {pid} is not this container's init")),
            "{stderr}"
        );
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
    }
    // A state pid that is not the stand-in init's pid in its namespace.
    let (out, _) = fx.run_inside("prestart", "ctr-1", Some(7));
    let (code, stderr) = code_and_stderr(&out);
    assert_eq!(code, 4, "{stderr}");
    assert!(stderr.contains("names pid 7"), "{stderr}");
    assert!(fx.state_files().is_empty(), "{:?}", fx.state_files());
}

#[test]
fn prestart_without_pid_is_refused() {
    require!(Need::Root);
    let alloc = "pod-0";
    let fx = applied(alloc);
    let (code, stderr) = code_and_stderr(&fx.run("prestart", &fx.state("ctr-1", None)));
    assert_eq!(code, 3, "{stderr}");
    assert!(stderr.contains("no pid"), "{stderr}");
    assert!(fx.state_files().is_empty());
}

#[test]
fn a_symlinked_state_dir_is_refused() {
    require!(Need::Root);
    let alloc = "pod-0";
    let fx = applied(alloc);
    fs::remove_dir(fx.path("state")).expect("rm state");
    fs::create_dir(fx.path("elsewhere")).expect("mkdir");
    std::os::unix::fs::symlink(fx.path("elsewhere"), fx.path("state")).expect("symlink");
    let (code, stderr) = code_and_stderr(&fx.run_inside("prestart", "ctr-1", Some(1)).0);
    assert_eq!(code, 4, "{stderr}");
    assert!(stderr.contains("is a symlink"), "{stderr}");
    assert_eq!(fs::read_dir(fx.path("elsewhere")).expect("dir").count(), 0);
}
