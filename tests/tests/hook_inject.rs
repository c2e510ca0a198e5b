//! `tessera-hook` in legacy mode, with real runc and crun and no CDI in the
//! runtime: a busybox bundle annotated with `tessera.io/alloc-id` gets exactly
//! its allocation's device nodes (numbers from the simulated node), passes the
//! device cgroup for them, sees the vGPU files read-only, and is bound to its
//! allocation while it exists — under every hook stage a runtime offers.

use std::fs;
use std::time::{Duration, Instant};

use tessera_e2e::hookenv;
use tessera_e2e::hookenv::{ALLOC_ANNOTATION, ALLOC_ID, HookFixture, probe_script};
use tessera_test_support::node::parse_stat_lines;
use tessera_test_support::oci::{Container, Runtime, run_bundle, unique_id};
use tessera_test_support::require;

/// The stages a legacy engine may register the hook at: `prestart` (hooks.d),
/// `createRuntime` (its successor), `createContainer` (CDI specs, containerd
/// base spec; runc reports pid 1 and crun pid 0 in that stage's state).
const STAGES: [&str; 3] = ["prestart", "createRuntime", "createContainer"];

fn fixture(tag: &str) -> Option<HookFixture> {
    if require(&hookenv::needs(&["runc", "crun"])).is_err() {
        return None;
    }
    Some(HookFixture::new(tag).expect("hook fixture"))
}

#[test]
fn legacy_injection_gives_exactly_the_allocation_and_binds_it_under_runc_and_crun() {
    let Some(fx) = fixture("inject") else { return };
    let started = Instant::now();
    let mut failures = Vec::new();
    for runtime in Runtime::ALL {
        for stage in STAGES {
            let what = format!("{runtime}, hook at {stage}");
            let bundle = fx
                .gpu_bundle(stage, &probe_script(&fx.granted))
                .expect("bundle");
            let id = unique_id("inject");
            let container = match Container::create(runtime, &bundle, &id) {
                Ok(c) => c,
                Err(e) => {
                    failures.push(format!("{what}: create failed: {}", e.stderr));
                    continue;
                }
            };

            // Bound while it exists: a record naming the container and its
            // init pid, and the allocation's accounting directory.
            let pid = container.pid().expect("pid");
            let records = fx.binding_records(ALLOC_ID, &id);
            if records.is_empty() {
                failures.push(format!(
                    "{what}: no binding record naming {id} under {}",
                    fx.binding_dir(ALLOC_ID).display()
                ));
            }
            let names_pid = records.iter().any(|r| {
                fs::read_to_string(r).is_ok_and(|t| {
                    t.split(|c: char| !c.is_ascii_digit())
                        .any(|n| n == pid.to_string())
                })
            });
            if !records.is_empty() && !names_pid {
                failures.push(format!(
                    "{what}: binding record {records:?} does not name the init pid {pid}"
                ));
            }
            if !fx.binding_dir(ALLOC_ID).join("accounting").is_dir() {
                failures.push(format!("{what}: no accounting directory"));
            }

            if let Err(e) = container.start_and_wait(Duration::from_secs(20)) {
                failures.push(format!("{what}: {e:#}"));
                continue;
            }
            let output = container.output();
            for problem in fx.probe_problems(&output) {
                failures.push(format!("{what}: {problem}"));
            }
            if let Err(e) = container.delete() {
                failures.push(format!("{what}: delete: {e:#}"));
            }
            let left = fx.binding_records(ALLOC_ID, &id);
            if !left.is_empty() {
                failures.push(format!(
                    "{what}: binding record still there after poststop: {left:?}"
                ));
            }
        }
    }
    eprintln!(
        "legacy injection: {} runs in {:?}",
        Runtime::ALL.len() * STAGES.len(),
        started.elapsed()
    );
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn alloc_id_from_the_env_only_binds_what_the_runtime_already_applied() {
    // TESSERA_ALLOC_ID is what a transient spec sets; but any image can set an
    // env variable, so on its own it must never make the hook inject. Where
    // the runtime applied the spec (devices in config.json), it binds.
    let Some(fx) = fixture("inject-env") else {
        return;
    };
    let env = format!("TESSERA_ALLOC_ID={ALLOC_ID}");
    for runtime in Runtime::ALL {
        // Applied by the runtime: bound, and the container has its devices.
        let mut bundle = fx.bundle(&probe_script(&fx.granted)).expect("bundle");
        fx.apply_edits_like_a_runtime(&mut bundle);
        bundle
            .env(&env)
            .hook("createContainer", &fx.hook_entry("prestart"))
            .hook("poststop", &fx.hook_entry("poststop"));
        let id = unique_id("env");
        let container = Container::create(runtime, &bundle, &id)
            .unwrap_or_else(|e| panic!("{runtime}: create: {}", e.stderr));
        assert!(
            !fx.binding_records(ALLOC_ID, &id).is_empty(),
            "{runtime}: no binding for a container the runtime gave its devices"
        );
        container
            .start_and_wait(Duration::from_secs(20))
            .expect("run");
        let problems = fx.probe_problems(&container.output());
        assert!(problems.is_empty(), "{runtime}: {}", problems.join("\n"));
        container.delete().expect("delete");
        assert!(
            fx.binding_records(ALLOC_ID, &id).is_empty(),
            "{runtime}: record left"
        );

        // Forged by an image: nothing injected, nothing bound.
        let mut bundle = fx
            .bundle("find /dev -name 'nvidia*'; ls /usr/local/tessera 2>&1; echo DONE")
            .expect("bundle");
        bundle
            .env(&env)
            .hook("prestart", &fx.hook_entry("prestart"))
            .hook("poststop", &fx.hook_entry("poststop"));
        let id = unique_id("env-forged");
        match Container::create(runtime, &bundle, &id) {
            Err(refused) => eprintln!(
                "{runtime}: forged TESSERA_ALLOC_ID refused: {}",
                refused.stderr
            ),
            Ok(container) => {
                assert!(
                    fx.binding_records(ALLOC_ID, &id).is_empty(),
                    "{runtime}: a forged TESSERA_ALLOC_ID got a binding record"
                );
                container
                    .start_and_wait(Duration::from_secs(20))
                    .expect("run");
                let output = container.output();
                assert!(
                    output.contains("DONE") && !output.contains("/dev/nvidia"),
                    "{runtime}: a forged TESSERA_ALLOC_ID got devices: {output}"
                );
                container.delete().expect("delete");
            }
        }
    }
}

#[test]
fn containers_without_an_allocation_pass_through_untouched() {
    let Some(fx) = fixture("inject-none") else {
        return;
    };
    let script =
        "find /dev -name 'nvidia*'; ls /usr/local/tessera /etc/ld.so.preload 2>&1; echo DONE";
    // No annotation, no TESSERA_ALLOC_ID; NVIDIA_VISIBLE_DEVICES is ignored
    // while the config does not accept it (the default).
    for env in [None, Some("NVIDIA_VISIBLE_DEVICES=all")] {
        for runtime in Runtime::ALL {
            let mut bundle = fx.bundle(script).expect("bundle");
            if let Some(env) = env {
                bundle.env(env);
            }
            bundle
                .hook("prestart", &fx.hook_entry("prestart"))
                .hook("poststop", &fx.hook_entry("poststop"));
            let out = run_bundle(runtime, &bundle, "none").expect("run");
            assert_eq!(out.create_error, None, "{runtime} {env:?}");
            assert!(out.output.contains("DONE"), "{runtime}: {}", out.output);
            assert!(
                !out.output.contains("/dev/nvidia"),
                "{runtime} {env:?}: a container without an allocation got {}",
                out.output
            );
            let alloc = fx.state_dir.join("alloc");
            let bound: Vec<_> = fs::read_dir(&alloc)
                .map(|d| d.flatten().map(|e| e.file_name()).collect())
                .unwrap_or_default();
            assert!(
                bound.is_empty(),
                "{runtime}: state under {alloc:?}: {bound:?}"
            );
        }
    }
}

#[test]
fn nvidia_visible_devices_resolves_against_the_static_spec_when_accepted() {
    let Some(fx) = fixture("inject-nvd") else {
        return;
    };
    fx.write_config(true).expect("config");
    let script =
        "for f in $(find /dev -name 'nvidia*' ! -type d); do stat -c '%n %F %t %T' $f; done";
    let mut want = fx.node.control_nodes();
    want.push(fx.node.gpu_node(0));
    want.sort();
    for runtime in Runtime::ALL {
        let mut bundle = fx.bundle(script).expect("bundle");
        bundle
            .env("NVIDIA_VISIBLE_DEVICES=0")
            .hook("prestart", &fx.hook_entry("prestart"))
            .hook("poststop", &fx.hook_entry("poststop"));
        let out = run_bundle(runtime, &bundle, "nvd").expect("run");
        assert_eq!(out.create_error, None, "{runtime}");
        let seen = parse_stat_lines(&out.output).expect("stat lines");
        assert_eq!(seen, want, "{runtime}: NVIDIA_VISIBLE_DEVICES=0");
    }
    // The annotation wins over NVIDIA_VISIBLE_DEVICES when both are present.
    let mut bundle = fx.bundle(&probe_script(&fx.granted)).expect("bundle");
    bundle
        .annotate(ALLOC_ANNOTATION, ALLOC_ID)
        .env("NVIDIA_VISIBLE_DEVICES=0")
        .hook("prestart", &fx.hook_entry("prestart"))
        .hook("poststop", &fx.hook_entry("poststop"));
    let out = run_bundle(Runtime::Runc, &bundle, "nvd-both").expect("run");
    assert_eq!(out.create_error, None);
    let problems = fx.probe_problems(&out.output);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn devices_already_in_config_json_are_bound_and_not_injected_again() {
    // The CDI path (and containerd 1.6's native Allocate): the runtime has put
    // the allocation's nodes and mounts into config.json. The probe passes on
    // the runtime's work alone (the probe's own positive control), and the
    // hook, still registered, only binds.
    let Some(fx) = fixture("inject-bound") else {
        return;
    };
    for runtime in Runtime::ALL {
        for hooked in [false, true] {
            let what = format!("{runtime}, hook registered: {hooked}");
            let mut bundle = fx.bundle(&probe_script(&fx.granted)).expect("bundle");
            fx.apply_edits_like_a_runtime(&mut bundle);
            bundle.annotate(ALLOC_ANNOTATION, ALLOC_ID);
            if hooked {
                bundle
                    .hook("createContainer", &fx.hook_entry("prestart"))
                    .hook("poststop", &fx.hook_entry("poststop"));
            }
            let id = unique_id("bound");
            let container = Container::create(runtime, &bundle, &id)
                .unwrap_or_else(|e| panic!("{what}: create: {}", e.stderr));
            let records = fx.binding_records(ALLOC_ID, &id);
            assert_eq!(
                !records.is_empty(),
                hooked,
                "{what}: binding records {records:?}"
            );
            container
                .start_and_wait(Duration::from_secs(20))
                .expect("run");
            let output = container.output();
            let problems = fx.probe_problems(&output);
            assert!(
                problems.is_empty(),
                "{what}:\n{}\n{output}",
                problems.join("\n")
            );
            container.delete().expect("delete");
            assert!(
                fx.binding_records(ALLOC_ID, &id).is_empty(),
                "{what}: record left"
            );
        }
    }
}
