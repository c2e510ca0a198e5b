//! `tessera-hook` in every pid-namespace arrangement Kubernetes makes — the
//! container's own (the default), one shared by the pod
//! (`shareProcessNamespace: true`) and the host's (`hostPID: true`) — at every
//! stage it accepts, under real runc and crun, on both paths: the runtime
//! applied the spec (CDI; the hook binds) and legacy injection (the hook
//! applies the edits itself).
//!
//! Each case checks that the binding names the container init's **host** pid
//! and its cgroup (read independently from `/proc/<pid>/cgroup`), that a legacy
//! container gets exactly its devices and files, and that the host is
//! unchanged: its mount table, the host side of the rootfs, and the sentinel
//! view of `/` (top level, `/dev/nvidia*`, `/etc/ld.so.preload`,
//! `/usr/local/tessera`). A state whose pid is
//! another process — forged by a wrapper the runtime runs in the hook's place —
//! is refused with nothing changed.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use tessera_e2e::hookenv;
use tessera_e2e::hookenv::{
    ALLOC_ANNOTATION, ALLOC_ID, HookFixture, SCRATCH_BASE, hook_binary, host_cgroups, probe_script,
};
use tessera_e2e::sentinel::{HostRootView, host_mount_points};
use tessera_test_support::oci::{Bundle, Container, HookEntry, Runtime, unique_id};
use tessera_test_support::require;

/// The host's mount points this test answers for: all but other tests'
/// scratch directories (their containers come and go meanwhile), and all of
/// this fixture's, where the bundles' rootfs live.
fn host_mounts(fx: &HookFixture) -> BTreeSet<String> {
    let own = fx.dir().display().to_string();
    host_mount_points()
        .expect("host mount table")
        .into_iter()
        .filter(|m| !m.starts_with(SCRATCH_BASE) || m.starts_with(&own))
        .collect()
}

const STAGES: [&str; 3] = ["prestart", "createRuntime", "createContainer"];

/// The pid-namespace arrangements of a Kubernetes pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PidMode {
    /// The container's own pid namespace (the Kubernetes default).
    Own,
    /// The pod's, shared with a pause container started first, so that the
    /// GPU container's init is not pid 1 there.
    Pod,
    /// The host's.
    Host,
}

const PID_MODES: [PidMode; 3] = [PidMode::Own, PidMode::Pod, PidMode::Host];

/// Where the container's devices come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Delivery {
    /// The runtime applied the transient spec (CDI): the hook binds.
    Cdi,
    /// The hook injects (legacy: annotation, no CDI in the runtime).
    Legacy,
}

fn fixture(tag: &str) -> Option<HookFixture> {
    if require(&hookenv::needs(&["runc", "crun"])).is_err() {
        return None;
    }
    Some(HookFixture::new(tag).expect("hook fixture"))
}

/// A pause container (`sleep`) of `runtime`, running; its init's host pid.
fn pause(fx: &HookFixture, runtime: Runtime) -> (Container, u32) {
    let bundle = fx.bundle("sleep 600").expect("pause bundle");
    let id = unique_id("pause");
    let container = Container::create(runtime, &bundle, &id)
        .unwrap_or_else(|e| panic!("{runtime}: pause container: {}", e.stderr));
    tessera_test_support::run(
        std::process::Command::new(runtime.program())
            .arg("start")
            .arg(&id),
    )
    .expect("start pause container");
    let pid = container.pid().expect("pause pid");
    (container, pid)
}

/// Puts `bundle` into the pid namespace `mode` asks for.
fn set_pid_mode(bundle: &mut Bundle, mode: PidMode, pause_pid: u32) {
    let pod = format!("/proc/{pause_pid}/ns/pid");
    let request = match mode {
        PidMode::Own => Some(None),
        PidMode::Pod => Some(Some(pod.as_str())),
        PidMode::Host => None,
    };
    bundle.set_namespace("pid", request);
}

/// The cgroup path a binding must name for `pid`, read from `/proc/<pid>/cgroup`.
fn expected_cgroup(pid: u32) -> String {
    host_cgroups(pid).expect("the init's cgroups").1
}

/// NVIDIA nodes on the host side of a rootfs: legacy injection makes them in
/// the container's `/dev` tmpfs, never in the directory on the host.
fn host_side_nodes(rootfs: &Path) -> Vec<String> {
    fs::read_dir(rootfs.join("dev"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("nvidia"))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn every_pid_namespace_mode_and_stage_binds_the_real_init_and_injects_only_into_the_container() {
    let Some(fx) = fixture("pidns") else { return };
    let mut failures = Vec::new();
    let mut cases = 0;
    for runtime in Runtime::ALL {
        let (pause_container, pause_pid) = pause(&fx, runtime);
        for mode in PID_MODES {
            for path in [Delivery::Cdi, Delivery::Legacy] {
                for stage in STAGES {
                    cases += 1;
                    let what = format!("{runtime}, pid ns {mode:?}, {path:?}, hook at {stage}");
                    if let Err(e) = one_case(&fx, runtime, mode, path, stage, pause_pid) {
                        failures.push(format!("{what}: {e}"));
                    }
                }
            }
        }
        drop(pause_container);
    }
    eprintln!("pid-namespace matrix: {cases} containers");
    assert_eq!(cases, 2 * 3 * 2 * 3);
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

fn one_case(
    fx: &HookFixture,
    runtime: Runtime,
    mode: PidMode,
    path: Delivery,
    stage: &str,
    pause_pid: u32,
) -> Result<(), String> {
    let mut bundle = fx
        .bundle(&probe_script(&fx.granted))
        .map_err(|e| e.to_string())?;
    set_pid_mode(&mut bundle, mode, pause_pid);
    bundle.annotate(ALLOC_ANNOTATION, ALLOC_ID);
    if path == Delivery::Cdi {
        fx.apply_edits_like_a_runtime(&mut bundle);
    }
    bundle
        .hook(stage, &fx.hook_entry("prestart"))
        .hook("poststop", &fx.hook_entry("poststop"));
    let mounts_before = host_mounts(fx);
    let host_before = HostRootView::read().map_err(|e| e.to_string())?;
    let id = unique_id("pidns");
    let container =
        Container::create(runtime, &bundle, &id).map_err(|e| format!("create: {}", e.stderr))?;
    let pid = container.pid().map_err(|e| e.to_string())?;

    // The binding names the init's host pid, and its cgroup.
    let records = fx.binding_records(ALLOC_ID, &id);
    let [record] = records.as_slice() else {
        return Err(format!("want one binding record, found {records:?}"));
    };
    let binding: Value = serde_json::from_slice(&fs::read(record).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    if binding["pid"].as_u64() != Some(u64::from(pid)) {
        return Err(format!(
            "binding names pid {}, the init's host pid is {pid}",
            binding["pid"]
        ));
    }
    let cgroup = expected_cgroup(pid);
    if binding["cgroup"].as_str() != Some(cgroup.as_str()) {
        return Err(format!(
            "binding names cgroup {}, the init's is {cgroup}",
            binding["cgroup"]
        ));
    }
    let want_mode = match path {
        Delivery::Cdi => "cdi",
        Delivery::Legacy => "legacy",
    };
    if binding["mode"] != want_mode {
        return Err(format!(
            "binding mode {}, want {want_mode}",
            binding["mode"]
        ));
    }

    // Nothing reached the host: no new mount, no node on the rootfs' host side.
    let mounts_created = host_mounts(fx);
    let new: BTreeSet<_> = mounts_created.difference(&mounts_before).collect();
    if !new.is_empty() {
        return Err(format!("new mounts in the host's namespace: {new:?}"));
    }
    let nodes = host_side_nodes(&bundle.rootfs());
    if !nodes.is_empty() {
        return Err(format!(
            "device nodes on the host side of the rootfs: {nodes:?}"
        ));
    }
    // The host's own /, /dev/nvidia*, /etc/ld.so.preload, /usr/local/tessera.
    let host_changes = HostRootView::read()
        .map_err(|e| e.to_string())?
        .changes_since(&host_before);
    if !host_changes.is_empty() {
        return Err(format!("the host changed: {host_changes:?}"));
    }

    // The container sees exactly its allocation.
    container
        .start_and_wait(Duration::from_secs(20))
        .map_err(|e| format!("{e:#}"))?;
    let output = container.output();
    let problems = fx.probe_problems(&output);
    if !problems.is_empty() {
        return Err(format!("{}\n{output}", problems.join("; ")));
    }
    container.delete().map_err(|e| format!("delete: {e:#}"))?;
    if !fx.binding_records(ALLOC_ID, &id).is_empty() {
        return Err("binding record left after poststop".into());
    }
    let after = host_mounts(fx);
    if after != mounts_before {
        return Err(format!(
            "host mount table changed: +{:?} -{:?}",
            after.difference(&mounts_before).collect::<Vec<_>>(),
            mounts_before.difference(&after).collect::<Vec<_>>()
        ));
    }
    Ok(())
}

/// A prestart "hook" that the runtime runs in the hook's place: it rewrites
/// the state's pid to `forged` and execs tessera-hook, which so keeps the
/// runtime as its parent, as a real hook has. The hook's stderr goes to the
/// returned file (crun does not show a hook's stderr).
fn forging_wrapper(fx: &HookFixture, forged: u32) -> (HookEntry, std::path::PathBuf) {
    let script = fx.dir().join(format!("forge-{forged}.sh"));
    let state = fx.dir().join(format!("forged-state-{forged}.json"));
    let stderr = fx.dir().join(format!("forged-stderr-{forged}"));
    fs::write(
        &script,
        format!(
            "#!/bin/sh\nsed 's/\"pid\": *[0-9]*/\"pid\":{forged}/' > {state}\nexec {hook} --config {config} prestart < {state} 2> {stderr}\n",
            state = state.display(),
            hook = hook_binary().display(),
            config = fx.config.display(),
            stderr = stderr.display(),
        ),
    )
    .expect("wrapper");
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).expect("chmod");
    let entry = HookEntry {
        path: script,
        args: vec!["forge".into()],
        env: Some(vec!["PATH=/usr/sbin:/usr/bin:/sbin:/bin".into()]),
    };
    (entry, stderr)
}

#[test]
fn a_forged_state_pid_is_refused_and_changes_nothing() {
    let Some(fx) = fixture("pidns-forged") else {
        return;
    };
    for runtime in Runtime::ALL {
        let (pause_container, pause_pid) = pause(&fx, runtime);
        // Another container's init, a kernel thread, and this test process.
        for forged in [pause_pid, 2, std::process::id()] {
            for path in [Delivery::Cdi, Delivery::Legacy] {
                let what = format!("{runtime}, {path:?}, state pid forged to {forged}");
                let mut bundle = fx.bundle("echo RAN").expect("bundle");
                bundle.annotate(ALLOC_ANNOTATION, ALLOC_ID);
                if path == Delivery::Cdi {
                    fx.apply_edits_like_a_runtime(&mut bundle);
                }
                let (wrapper, stderr) = forging_wrapper(&fx, forged);
                bundle.hook("prestart", &wrapper);
                let mounts_before = host_mounts(&fx);
                let id = unique_id("forged");
                if Container::create(runtime, &bundle, &id).is_ok() {
                    panic!("{what}: the hook accepted a forged pid");
                }
                let said = fs::read_to_string(&stderr).unwrap_or_default();
                assert!(
                    said.contains(&format!("pid {forged} is not this container's init")),
                    "{what}: the hook said {said:?}"
                );
                assert_eq!(said.lines().count(), 1, "{what}: {said}");
                assert!(
                    fx.binding_records(ALLOC_ID, &id).is_empty(),
                    "{what}: a binding was written"
                );
                assert_eq!(
                    host_mounts(&fx),
                    mounts_before,
                    "{what}: the host mount table changed"
                );
                assert!(host_side_nodes(&bundle.rootfs()).is_empty(), "{what}");
            }
        }
        drop(pause_container);
    }
}

#[test]
fn a_container_with_its_own_cgroup_namespace_is_bound_to_its_real_cgroup() {
    // A createContainer hook runs in the container's cgroup namespace, where
    // every cgroup path reads "/"; the binding must still name the cgroup the
    // runtime made (linux.cgroupsPath), as the host sees it.
    let Some(fx) = fixture("pidns-cgroupns") else {
        return;
    };
    let mut failures = Vec::new();
    for runtime in Runtime::ALL {
        for stage in ["prestart", "createContainer"] {
            let what = format!("{runtime}, cgroup namespace, hook at {stage}");
            let mut bundle = fx.bundle(&probe_script(&fx.granted)).expect("bundle");
            let id = unique_id("cgns");
            let cgroups_path = format!("/{id}");
            bundle.set_namespace("cgroup", Some(None));
            bundle.config_mut()["linux"]["cgroupsPath"] = json!(cgroups_path);
            bundle.annotate(ALLOC_ANNOTATION, ALLOC_ID);
            fx.apply_edits_like_a_runtime(&mut bundle);
            bundle
                .hook(stage, &fx.hook_entry("prestart"))
                .hook("poststop", &fx.hook_entry("poststop"));
            let container = match Container::create(runtime, &bundle, &id) {
                Ok(c) => c,
                Err(e) => {
                    failures.push(format!("{what}: create: {}", e.stderr));
                    continue;
                }
            };
            let pid = container.pid().expect("pid");
            let cgroup = expected_cgroup(pid);
            if !cgroup.ends_with(&cgroups_path) {
                failures.push(format!(
                    "{what}: set-up: the init's cgroup {cgroup} is not {cgroups_path}"
                ));
            }
            let records = fx.binding_records(ALLOC_ID, &id);
            let named = records.first().and_then(|r| {
                let b: Value = serde_json::from_slice(&fs::read(r).ok()?).ok()?;
                Some((b["pid"].as_u64(), b["cgroup"].as_str().map(str::to_owned)))
            });
            if named != Some((Some(u64::from(pid)), Some(cgroup.clone()))) {
                failures.push(format!(
                    "{what}: binding names {named:?}, want pid {pid} and cgroup {cgroup}"
                ));
            }
            if let Err(e) = container.delete() {
                failures.push(format!("{what}: delete: {e:#}"));
            }
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}
