//! podman without CDI, with Tessera's hooks.d files (`packaging/oci-hooks.d`,
//! only the hook's path and `--config` changed for the test): a container run
//! with `--annotation tessera.io/alloc-id=…` gets its allocation through
//! `tessera-hook`, is bound while it runs, and is unbound after it exits;
//! under crun (podman's default) and runc.

use std::fs;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use tessera_e2e::hookenv;
use tessera_e2e::hookenv::{
    ALLOC_ANNOTATION, ALLOC_ID, HookFixture, hook_binary, podman_with_hooks, probe_script,
};
use tessera_test_support::require;

/// Copies the shipped hooks.d files into `dir`, pointing them at the test's
/// hook binary and config; everything else stays as shipped.
fn install_hooks_d(fx: &HookFixture, dir: &Path) {
    fs::create_dir_all(dir).expect("hooks dir");
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/oci-hooks.d");
    for name in ["tessera-hook.json", "tessera-hook-poststop.json"] {
        let mut file: Value =
            serde_json::from_slice(&fs::read(shipped.join(name)).expect(name)).expect(name);
        file["hook"]["path"] = hook_binary().display().to_string().into();
        let verb = file["hook"]["args"][1].as_str().expect("verb").to_owned();
        file["hook"]["args"] = serde_json::json!(fx.hook_args(&verb));
        fs::write(
            dir.join(name),
            serde_json::to_vec_pretty(&file).expect("json"),
        )
        .expect(name);
    }
}

#[test]
fn podman_with_the_hooks_d_files_injects_and_binds_the_allocation() {
    if require(&hookenv::needs(&["podman", "runc", "crun"])).is_err() {
        return;
    }
    let fx = HookFixture::new("podman").expect("fixture");
    let hooks_dir = fx.dir().join("hooks.d");
    install_hooks_d(&fx, &hooks_dir);
    let mut failures = Vec::new();
    for runtime in ["crun", "runc"] {
        let bundle = fx.bundle("true").expect("bundle");
        let cidfile = fx.dir().join(format!("{runtime}.cid"));
        // Probe, then linger so the test can see the binding while it runs.
        let script = format!("{}; sleep 2", probe_script(&fx.granted));
        let mut child = podman_with_hooks(
            runtime,
            &hooks_dir,
            &[(ALLOC_ANNOTATION, ALLOC_ID)],
            &["--cidfile".as_ref(), cidfile.as_os_str()],
            &bundle.rootfs(),
            &script,
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("podman");

        // While it runs: a binding record naming the container id.
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut bound = false;
        while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
            if let Ok(id) = fs::read_to_string(&cidfile) {
                let id = id.trim().to_owned();
                if !id.is_empty() && !fx.binding_records(ALLOC_ID, &id).is_empty() {
                    bound = true;
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().expect("podman output");
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            failures.push(format!(
                "{runtime}: podman exited with {}: {}{stdout}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
            continue;
        }
        if !bound {
            failures.push(format!(
                "{runtime}: no binding record while the container ran"
            ));
        }
        for problem in fx.probe_problems(&stdout) {
            failures.push(format!("{runtime}: {problem}"));
        }
        let id = fs::read_to_string(&cidfile).unwrap_or_default();
        let left = fx.binding_records(ALLOC_ID, id.trim());
        if !left.is_empty() {
            failures.push(format!(
                "{runtime}: binding record left after the container exited: {left:?}"
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn podman_without_the_annotation_does_not_run_the_hook() {
    if require(&hookenv::needs(&["podman", "crun"])).is_err() {
        return;
    }
    let fx = HookFixture::new("podman-none").expect("fixture");
    let hooks_dir = fx.dir().join("hooks.d");
    install_hooks_d(&fx, &hooks_dir);
    // No annotation: the hooks.d `when` does not match, so nothing is
    // injected and nothing recorded.
    let bundle = fx.bundle("true").expect("bundle");
    let out = podman_with_hooks(
        "crun",
        &hooks_dir,
        &[],
        &[],
        &bundle.rootfs(),
        "find /dev -name 'nvidia*'; echo DONE",
    )
    .output()
    .expect("podman");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout.trim(), "DONE");
    assert!(
        fs::read_dir(fx.state_dir.join("alloc")).map_or(true, |mut d| d.next().is_none()),
        "state written for a container without an allocation"
    );
}
