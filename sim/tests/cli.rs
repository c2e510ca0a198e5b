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
