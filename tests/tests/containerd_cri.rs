//! `tessera-hook` under a real containerd 1.7 driven through its CRI API the
//! way kubelet drives it, in the three pid namespace arrangements Kubernetes
//! uses: a pid namespace per container (the default), one per pod
//! (`shareProcessNamespace: true`, CRI pid mode POD) and the host's
//! (`hostPID: true`, NODE).
//!
//! - The CDI path (containerd `enable_cdi`): a GPU container requests the
//!   transient spec's device `tessera.io/alloc=<id>`; containerd applies the
//!   edits and runc runs the hook the spec names at `createContainer` and
//!   `poststop`.
//! - The containerd 1.6 path (no CDI): the runc handler's
//!   `base_runtime_spec` (packaging/containerd) names the hook for every
//!   container, `container_annotations` lets `tessera.io/alloc-id` through,
//!   and the hook injects devices and mounts itself.
//!
//! In both, the binding record must name the container init's *host* pid and
//! its cgroups while the container runs, and be gone after it is removed; the
//! container sees exactly its allocation. In POD mode a sleeper container is
//! started first, so the GPU container's init is not pid 1 in the
//! shared namespace: a hook that takes the state's namespace pid for a host
//! pid fails there.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use serde_json::Value;
use tessera_e2e::hookenv::{
    ALLOC_ANNOTATION, HookFixture, hook_binary, host_cgroups, probe_script,
};
use tessera_e2e::sentinel::{self, HostRootView, host_mount_points, mounts_under};
use tessera_test_support::containerd::{
    self, ContainerSpec, Containerd, Options, PidMode, write_json,
};
use tessera_test_support::require;

/// One containerd at a time in this binary: the legacy cases compare the host's
/// mount table before and after, which another pod would disturb, and the
/// machine has two cores.
static SERIAL: Mutex<()> = Mutex::new(());

/// The two ways a container gets its allocation under containerd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// containerd 1.7 with `enable_cdi`: the runtime applies the transient spec.
    Cdi,
    /// containerd 1.6 style: base runtime spec + annotation, the hook injects.
    Legacy,
}

impl Route {
    fn tag(self) -> &'static str {
        match self {
            Route::Cdi => "cdi",
            Route::Legacy => "legacy",
        }
    }
}

/// A fixture and a daemon configured for `route`. Field order is drop order:
/// the daemon (and its pods) go before the fixture's directory.
struct Env {
    daemon: Containerd,
    fx: HookFixture,
}

fn setup(route: Route, mode: PidMode) -> Option<Env> {
    let mut needs = tessera_e2e::hookenv::needs(&[]);
    needs.extend(containerd::needs());
    require(&needs).ok()?;
    let fx =
        HookFixture::new(&format!("cri-{}-{}", route.tag(), mode_tag(mode))).expect("hook fixture");
    let options = match route {
        Route::Cdi => Options {
            enable_cdi: true,
            cdi_spec_dirs: vec![fx.cdi_dir.clone()],
            ..Options::default()
        },
        Route::Legacy => {
            let spec = fx.dir().join("base-runtime-spec.json");
            write_json(&spec, &base_runtime_spec(&fx)).expect("base runtime spec");
            Options {
                enable_cdi: false,
                base_runtime_spec: Some(spec),
                container_annotations: vec![ALLOC_ANNOTATION.to_owned()],
                ..Options::default()
            }
        }
    };
    let started = Instant::now();
    let daemon = Containerd::start(options).expect("containerd");
    let v = daemon.version();
    eprintln!(
        "{} {} (CRI {}) up in {:?}, in {}",
        v.runtime_name,
        v.runtime_version,
        v.runtime_api_version,
        started.elapsed(),
        daemon.dirs().base.display()
    );
    assert!(
        v.runtime_version.starts_with("1.7.") || v.runtime_version.starts_with("v1.7."),
        "want containerd 1.7, the daemon says {}",
        v.runtime_version
    );
    Some(Env { daemon, fx })
}

fn mode_tag(mode: PidMode) -> &'static str {
    match mode {
        PidMode::Container => "container",
        PidMode::Pod => "pod",
        PidMode::Node => "node",
    }
}

/// The shipped `packaging/containerd/base-runtime-spec.json` with only the
/// hook's path (the static test build) and `--config` (the fixture's) changed,
/// as `hook_podman.rs` does with the hooks.d files.
fn base_runtime_spec(fx: &HookFixture) -> Value {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../packaging/containerd/base-runtime-spec.json");
    let mut spec: Value =
        serde_json::from_slice(&fs::read(&shipped).expect("shipped base runtime spec"))
            .expect("base runtime spec JSON");
    let mut seen = 0;
    for stage in ["createContainer", "poststop"] {
        let hooks = spec["hooks"][stage]
            .as_array_mut()
            .unwrap_or_else(|| panic!("the shipped base spec has no {stage} hooks"));
        for hook in hooks {
            if hook["path"] != "/usr/bin/tessera-hook" {
                continue;
            }
            let verb = hook["args"][1].as_str().expect("verb").to_owned();
            hook["path"] = hook_binary().display().to_string().into();
            hook["args"] = serde_json::json!(fx.hook_args(&verb));
            seen += 1;
        }
    }
    assert_eq!(
        seen, 2,
        "the shipped base spec should name tessera-hook at createContainer and poststop"
    );
    spec
}

/// Why the fixture's transient spec for `alloc_id` cannot serve the CDI
/// path, if it cannot: under containerd the spec's own hook entries are the
/// only ones, so they must run the test's hook with the fixture's `--config`
/// at `createContainer` and `poststop` (else the hook would bind into the
/// host's real `/var/lib/tessera`).
fn transient_spec_problem(fx: &HookFixture, alloc_id: &str) -> Option<String> {
    let path = fx.transient_spec_path(alloc_id);
    let spec: Value = match fs::read(&path).map(|b| serde_json::from_slice(&b)) {
        Ok(Ok(v)) => v,
        other => return Some(format!("{}: {other:?}", path.display())),
    };
    let hooks: Vec<&Value> = spec["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(std::iter::once(&spec))
        .filter_map(|d| d["containerEdits"]["hooks"].as_array())
        .flatten()
        .collect();
    let config = fx.config.display().to_string();
    let hook = hook_binary().display().to_string();
    let mut missing = Vec::new();
    for stage in ["createContainer", "poststop"] {
        let ok = hooks.iter().any(|h| {
            h["hookName"] == stage
                && h["path"] == hook.as_str()
                && h["args"].as_array().is_some_and(|args| {
                    args.windows(2)
                        .any(|w| w[0] == "--config" && w[1] == config.as_str())
                })
        });
        if !ok {
            missing.push(stage);
        }
    }
    (!missing.is_empty()).then(|| {
        format!(
            "the fixture's transient spec {} does not name {hook} with --config {config} at {} \
             (hookenv::transient_spec); not run, the hook would use the host's /var/lib/tessera. \
             Hooks in the spec: {}",
            path.display(),
            missing.join(" and "),
            serde_json::to_string(&hooks).unwrap_or_default()
        )
    })
}

/// The `NSpid` line of `/proc/<pid>/status`: the pid in each nested namespace.
fn ns_pids(pid: u32) -> Vec<u32> {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// What is wrong with the binding record of `alloc_id` for a container whose
/// init has host pid `pid`.
fn binding_problems(fx: &HookFixture, alloc_id: &str, container_id: &str, pid: u32) -> Vec<String> {
    let path = fx.binding_dir(alloc_id).join("binding.json");
    let record: Value = match fs::read(&path).map(|b| serde_json::from_slice(&b)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => return vec![format!("{}: not JSON: {e}", path.display())],
        Err(e) => {
            return vec![format!(
                "no binding record {} while the container runs: {e}",
                path.display()
            )];
        }
    };
    let mut problems = Vec::new();
    if record["containerId"] != container_id {
        problems.push(format!(
            "binding names container {}, not {container_id}",
            record["containerId"]
        ));
    }
    if record["allocId"] != alloc_id {
        problems.push(format!("binding names allocation {}", record["allocId"]));
    }
    if record["pid"].as_u64() != Some(u64::from(pid)) {
        problems.push(format!(
            "binding names pid {}, but the container's init is host pid {pid} (NSpid {:?})",
            record["pid"],
            ns_pids(pid)
        ));
    }
    match host_cgroups(pid) {
        Ok((map, preferred)) => {
            let recorded: Option<BTreeMap<String, String>> =
                serde_json::from_value(record["cgroups"].clone()).ok();
            if recorded.as_ref() != Some(&map) {
                problems.push(format!(
                    "binding cgroups {} differ from /proc/{pid}/cgroup {map:?}",
                    record["cgroups"]
                ));
            }
            if record["cgroup"] != preferred.as_str() {
                problems.push(format!(
                    "binding cgroup {} differs from /proc/{pid}/cgroup's {preferred:?}",
                    record["cgroup"]
                ));
            }
        }
        Err(e) => problems.push(e),
    }
    if !fx.binding_dir(alloc_id).join("accounting").is_dir() {
        problems.push("no accounting directory".to_owned());
    }
    problems
}

/// Char and block device nodes under `root` (not crossing into other
/// filesystems' mounts is not needed: the host-side rootfs has none below it).
fn device_nodes_under(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(ft) = entry.file_type() else { continue };
            if ft.is_dir() {
                stack.push(entry.path());
            } else if ft.is_char_device() || ft.is_block_device() {
                found.push(entry.path());
            }
        }
    }
    found
}

/// Runs one case: a pod in pid mode `mode`, (POD: a sleeper first), a GPU
/// container given its allocation the `route` way; checks the binding, the
/// container's view, the unbinding, and for the legacy path the host.
/// Returns the failures, one line each.
fn run_case(env: &Env, route: Route, mode: PidMode) -> Vec<String> {
    let Env { daemon, fx } = env;
    let alloc_id = format!("cri-{}-{}", route.tag(), mode_tag(mode));
    let what = format!("{} path, pid mode {mode}", route.tag());
    let mut failures = Vec::new();
    fx.write_transient_spec(&alloc_id).expect("transient spec");
    if route == Route::Cdi
        && let Some(problem) = transient_spec_problem(fx, &alloc_id)
    {
        return vec![format!("{what}: {problem}")];
    }

    let host_before = HostRootView::read().expect("host view");
    let mounts_before = host_mount_points().expect("host mounts");
    let node_before = sentinel::snapshot(&fx.node_root).expect("node snapshot");

    let pod = daemon
        .run_pod(&format!("gpu-{}-{}", route.tag(), mode_tag(mode)), mode)
        .unwrap_or_else(|e| panic!("{what}: {e:#}\n{}", daemon.log_tail(20)));
    let sleep = ["sleep", "infinity"];
    if mode == PidMode::Pod {
        pod.run_container(&ContainerSpec::new("sleeper", &sleep))
            .unwrap_or_else(|e| panic!("{what}: sleeper: {e:#}"));
    }
    let spec = match route {
        Route::Cdi => {
            ContainerSpec::new("gpu", &sleep).cdi_device(&format!("tessera.io/alloc={alloc_id}"))
        }
        Route::Legacy => ContainerSpec::new("gpu", &sleep).annotation(ALLOC_ANNOTATION, &alloc_id),
    };
    let gpu = match pod.run_container(&spec) {
        Ok(id) => id,
        Err(e) => {
            failures.push(format!("{what}: the GPU container did not start: {e:#}"));
            return failures;
        }
    };
    let status = daemon.container_status(&gpu).expect("container status");
    let pid = match status.host_pid() {
        Ok(pid) => pid,
        Err(e) => {
            failures.push(format!("{what}: {e:#}"));
            return failures;
        }
    };
    if !status.running() {
        failures.push(format!(
            "{what}: GPU container not running: {:?}",
            status.status
        ));
    }

    // The arrangement itself (not the hook): what containerd put into the
    // OCI spec, and where the init sits.
    let oci = status.runtime_spec();
    match route {
        Route::Cdi => {
            let hook = hook_binary().display().to_string();
            let named = oci["hooks"]["createContainer"]
                .as_array()
                .is_some_and(|hooks| hooks.iter().any(|h| h["path"] == hook.as_str()));
            assert!(
                named,
                "{what}: containerd did not apply the transient spec's hook; OCI hooks: {}",
                oci["hooks"]
            );
        }
        Route::Legacy => assert_eq!(
            oci["annotations"][ALLOC_ANNOTATION], alloc_id,
            "{what}: container_annotations did not pass {ALLOC_ANNOTATION} into the OCI spec"
        ),
    }
    let nspid = ns_pids(pid);
    let arranged = match mode {
        PidMode::Container => nspid.len() >= 2 && nspid.last() == Some(&1),
        PidMode::Pod => nspid.len() >= 2 && nspid.last().is_some_and(|p| *p > 1),
        PidMode::Node => nspid == [pid],
    };
    assert!(
        arranged,
        "{what}: the GPU container's init (host pid {pid}) has NSpid {nspid:?}, \
         not what pid mode {mode} gives"
    );
    eprintln!("{what}: GPU container {gpu}, init host pid {pid}, NSpid {nspid:?}");

    for problem in binding_problems(fx, &alloc_id, &gpu, pid) {
        failures.push(format!("{what}: {problem}"));
    }

    let probe = probe_script(&fx.granted);
    match daemon.exec_sync(&gpu, &["sh", "-c", &probe], 30) {
        Ok(out) => {
            let problems = fx.probe_problems(&out.stdout);
            if !problems.is_empty() || out.exit_code != 0 {
                failures.push(format!(
                    "{what}: in the container (exit {}):\n  {}\n  stdout: {}\n  stderr: {}",
                    out.exit_code,
                    problems.join("\n  "),
                    out.stdout.trim(),
                    out.stderr.trim()
                ));
            }
        }
        Err(e) => failures.push(format!("{what}: exec: {e:#}")),
    }

    // The host while it runs: nothing mounted into the fixture or below the
    // container's host-side rootfs, no device node made on the host side.
    let rootfs = daemon.dirs().bundle(&gpu).join("rootfs");
    if route == Route::Legacy {
        let fixture_mounts = mounts_under(fx.dir()).expect("mounts");
        if !fixture_mounts.is_empty() {
            failures.push(format!(
                "{what}: host mounts under the fixture: {fixture_mounts:?}"
            ));
        }
        let rootfs_str = rootfs.display().to_string();
        let below: Vec<String> = mounts_under(&rootfs)
            .expect("mounts")
            .into_iter()
            .filter(|m| *m != rootfs_str)
            .collect();
        if !below.is_empty() {
            failures.push(format!(
                "{what}: host mounts below the container's rootfs: {below:?}"
            ));
        }
        if !rootfs.is_dir() {
            failures.push(format!(
                "{what}: no host-side rootfs at {}",
                rootfs.display()
            ));
        }
        let nodes = device_nodes_under(&rootfs);
        if !nodes.is_empty() {
            failures.push(format!(
                "{what}: device nodes in the container's rootfs on the host side: {nodes:?}"
            ));
        }
    }

    if let Err(e) = pod.stop_and_remove_container(&gpu) {
        failures.push(format!("{what}: stop/remove: {e:#}"));
    }
    let record = fx.binding_dir(&alloc_id).join("binding.json");
    if record.exists() {
        failures.push(format!(
            "{what}: binding record {} still there after the container was removed: {}",
            record.display(),
            fs::read_to_string(&record).unwrap_or_default()
        ));
    }
    if let Err(e) = pod.remove() {
        failures.push(format!("{what}: removing the pod: {e:#}"));
    }

    if route == Route::Legacy {
        let mounts_after = host_mount_points().expect("host mounts");
        if mounts_after != mounts_before {
            failures.push(format!(
                "{what}: host mount table changed: added {:?}, removed {:?}",
                mounts_after.difference(&mounts_before).collect::<Vec<_>>(),
                mounts_before.difference(&mounts_after).collect::<Vec<_>>()
            ));
        }
        let host = HostRootView::read()
            .expect("host view")
            .changes_since(&host_before);
        if !host.is_empty() {
            failures.push(format!("{what}: the host changed: {host:?}"));
        }
        let node = sentinel::changes(
            &node_before,
            &sentinel::snapshot(&fx.node_root).expect("node snapshot"),
        );
        if !node.is_empty() {
            failures.push(format!(
                "{what}: the simulated node's tree changed: {node:?}"
            ));
        }
    }
    failures
}

fn check(route: Route, mode: PidMode) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(env) = setup(route, mode) else {
        return;
    };
    let started = Instant::now();
    let failures = run_case(&env, route, mode);
    eprintln!(
        "{} path, pid mode {mode}: {} in {:?}",
        route.tag(),
        if failures.is_empty() { "ok" } else { "FAILED" },
        started.elapsed()
    );
    if !failures.is_empty() {
        panic!(
            "\n{}\ncontainerd log (last lines):\n{}",
            failures.join("\n"),
            env.daemon.log_tail(15)
        );
    }
}

/// One test per route and pid namespace mode, each named for what it pins.
macro_rules! route_and_mode_tests {
    ($($name:ident: $route:ident, $mode:ident;)+) => {$(
        #[test]
        fn $name() {
            check(Route::$route, PidMode::$mode);
        }
    )+};
}

route_and_mode_tests! {
    cdi_own_pid_namespace_binds_the_host_pid_and_gives_exactly_the_allocation: Cdi, Container;
    cdi_shared_pod_pid_namespace_binds_the_host_pid_and_gives_exactly_the_allocation: Cdi, Pod;
    cdi_host_pid_namespace_binds_the_host_pid_and_gives_exactly_the_allocation: Cdi, Node;
    legacy_base_spec_own_pid_namespace_injects_binds_and_leaves_the_host_alone: Legacy, Container;
    legacy_base_spec_shared_pod_pid_namespace_injects_binds_and_leaves_the_host_alone: Legacy, Pod;
    legacy_base_spec_host_pid_namespace_injects_binds_and_leaves_the_host_alone: Legacy, Node;
}
