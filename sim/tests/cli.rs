//! The `tessera-sim` binary: exit codes and one-line errors.

mod common;

use std::process::Command;

use tessera_test_support::{Need, require};

fn sim() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tessera-sim"))
}

#[test]
fn bad_profile_exits_1_with_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let profile = tmp.path().join("bad.toml");
    std::fs::write(&profile, "[[gpu]]\nmodel = \"H300\"\n").unwrap();
    let out = sim()
        .args(["create", "--profile"])
        .arg(&profile)
        .arg("--root")
        .arg(tmp.path().join("root"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(
        stderr,
        format!(
            "tessera-sim: profile {}: gpu[0].model: unknown GPU model \"H300\" (known: A30, A100-40GB, A100-80GB, H100-80GB, H100-94GB, H200-141GB, B200, RTX-PRO-6000)\n",
            profile.display()
        )
    );
    assert!(out.stdout.is_empty());
    assert!(!tmp.path().join("root").exists());
}

#[test]
fn unknown_profile_name_exits_1() {
    let out = sim()
        .args(["create", "--profile", "nosuch", "--root", "/nonexistent/r"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.starts_with("tessera-sim: unknown profile \"nosuch\""),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[test]
fn usage_errors_are_one_line_exit_2() {
    let out = sim().args(["create", "--root", "/tmp/x"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("--profile"), "{stderr}");
}

#[test]
fn profiles_lists_every_shipped_profile() {
    let out = sim().arg("profiles").output().unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    for (name, _) in tessera_sim::profile::shipped_profiles() {
        assert!(
            stdout
                .lines()
                .any(|l| l.split_whitespace().next() == Some(name)),
            "{name} missing from:\n{stdout}"
        );
    }
}

#[test]
fn show_without_a_node_exits_1() {
    let tmp = tempfile::tempdir().unwrap();
    let out = sim()
        .arg("show")
        .arg("--root")
        .arg(tmp.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("no simulated node at"), "{stderr}");
}

#[test]
fn create_then_show() {
    require!(Need::DeviceNodes);
    let tmp = tempfile::tempdir().unwrap();
    let nvml = common::fake_nvml(tmp.path());
    let cuda = common::fake_cuda(tmp.path());
    let root = tmp.path().join("root");
    let out = sim()
        .args(["create", "--profile", "demo", "--root"])
        .arg(&root)
        .arg("--nvml-lib")
        .arg(&nvml)
        .arg("--cuda-lib")
        .arg(&cuda)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = sim().arg("show").arg("--root").arg(&root).output().unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.contains("GPU 1 A100-40GB"), "{stdout}");
    assert!(stdout.contains("MIG 2 GI  9 CI 0 1g.5gb"), "{stdout}");
    assert_eq!(
        std::fs::read(root.join("usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1")).unwrap(),
        std::fs::read(&nvml).unwrap()
    );
    assert_eq!(
        std::fs::read(root.join("usr/lib/x86_64-linux-gnu/libcuda.so.1")).unwrap(),
        std::fs::read(&cuda).unwrap()
    );
}

/// A demo node's state file (no device nodes) in a temporary root.
fn demo_state() -> (tempfile::TempDir, tessera_sim::state::StateStore) {
    let tmp = tempfile::tempdir().expect("make a temporary directory");
    let state = tessera_sim::profile::NodeProfile::load("demo")
        .and_then(|p| p.node_state("demo"))
        .expect("the demo profile lays out");
    let store =
        tessera_sim::state::StateStore::write_new(tmp.path(), &state).expect("write the state");
    (tmp, store)
}

#[test]
fn inject_xid_and_lose_gpu_record_events_in_order() {
    let (tmp, store) = demo_state();
    let run = |args: &[&str]| {
        let out = sim()
            .args(args)
            .arg("--root")
            .arg(tmp.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let state = store.read().unwrap();
    let mig = &state.gpus[1];
    let (gi, ci) = (
        mig.gpu_instances[0].id,
        mig.gpu_instances[0].compute_instances[0].id,
    );
    let line = run(&["inject-xid", "--gpu", "0", "--xid", "79"]);
    assert_eq!(
        line,
        format!("GPU 0 {}: xid 79 (event 1)\n", state.gpus[0].uuid)
    );
    let line = run(&[
        "inject-xid",
        "--gpu",
        &mig.uuid,
        "--xid",
        "48",
        "--gi",
        &gi.to_string(),
        "--ci",
        &ci.to_string(),
    ]);
    assert!(
        line.contains(&format!("GI {gi} CI {ci}: xid 48 (event 2)")),
        "{line}"
    );
    assert!(run(&["lose-gpu", "--gpu", "1"]).ends_with(": lost (event 3)\n"));
    assert!(run(&["lose-gpu", "--gpu", "1"]).ends_with(": already lost\n"));
    let health = store.read().unwrap().health;
    assert_eq!(health.lost, [1]);
    assert_eq!(
        health
            .events
            .iter()
            .map(|e| (e.seq, e.gpu))
            .collect::<Vec<_>>(),
        [(1, 0), (2, 1), (3, 1)]
    );
    assert_eq!(
        health.events[1].kind,
        tessera_sim::health::EventKind::Xid {
            xid: 48,
            instance: Some((gi, ci))
        }
    );
    assert!(run(&["lose-gpu", "--gpu", "1", "--restore"]).ends_with(": answering (event 4)\n"));
    assert!(store.read().unwrap().health.lost.is_empty());
}

#[test]
fn bad_health_arguments_exit_2_with_one_line_and_change_nothing() {
    let (tmp, store) = demo_state();
    let before = std::fs::read(store.state_path()).unwrap();
    for (args, needle) in [
        (&["inject-xid", "--gpu", "7", "--xid", "79"][..], "--gpu 7"),
        (
            &["inject-xid", "--gpu", "GPU-nope", "--xid", "79"][..],
            "--gpu GPU-nope",
        ),
        (&["inject-xid", "--gpu", "0", "--xid", "0"][..], "--xid"),
        (&["inject-xid", "--gpu", "0", "--xid", "x79"][..], "--xid"),
        (
            &["inject-xid", "--gpu", "0", "--xid", "79", "--gi", "1"][..],
            "--ci",
        ),
        (
            &[
                "inject-xid",
                "--gpu",
                "0",
                "--xid",
                "79",
                "--gi",
                "1",
                "--ci",
                "0",
            ][..],
            "MIG is off",
        ),
        (
            &[
                "inject-xid",
                "--gpu",
                "1",
                "--xid",
                "79",
                "--gi",
                "99",
                "--ci",
                "0",
            ][..],
            "--gi 99",
        ),
        (&["lose-gpu", "--gpu", "2"][..], "--gpu 2"),
    ] {
        let out = sim()
            .args(args)
            .arg("--root")
            .arg(tmp.path())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    assert_eq!(std::fs::read(store.state_path()).unwrap(), before);
}

#[test]
fn health_commands_without_a_node_exit_1() {
    let tmp = tempfile::tempdir().unwrap();
    let out = sim()
        .args(["lose-gpu", "--gpu", "0", "--root"])
        .arg(tmp.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("no simulated node at"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}
