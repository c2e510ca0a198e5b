//! SM sharing across pid namespaces: two tenants at `gpucores: 30`, both
//! busy, each in a pid namespace of its own (`unshare --pid --fork`), on one
//! simulated H100. NVML (the stand-in) reports their host pids, which their
//! vGPU libraries cannot see; the node monitor maps those pids to the
//! tenants' allocations (binding records, `/proc/<pid>/ns/pid`) and publishes
//! each allocation's utilization into its accounting region.
//!
//! The judge is the simulated device's own timeline (device time each
//! tenant's kernels really took, by host pid), not the NVML figures the
//! limiter and the monitor read.
//!
//! With the monitor each tenant gets 30 ± 5 %. Without it (the control,
//! same set-up) each library falls back to the whole device's utilization
//! and both end far below their share (about 15 % each).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tessera_driver::GpuDriver;
use tessera_driver::nvml::NvmlDriver;
use tessera_model::alloc::BindingRecord;
use tessera_model::contract::node::{ACCOUNTING_SUBDIR, ALLOC_DIR, BINDING_FILE};
use tessera_model::contract::vgpu::ACCOUNTING_FILE;
use tessera_plugin::monitor::{Monitor, MonitorConfig};
use tessera_test_support::node::{SimNode, StandIn};
use tessera_test_support::timeline::{self, DeviceTimeline};
use tessera_test_support::{Need, artefact, require};

/// The limiter measures over half a second and starts unthrottled; the
/// monitor needs a pass or two after the binding appears.
const WARMUP: Duration = Duration::from_millis(2000);
/// The window achieved device time is measured over.
const WINDOW: Duration = Duration::from_millis(2000);
/// Seconds each workload runs: past the window's end.
const RUN_SECONDS: &str = "4.6";
const TARGET: f64 = 30.0;

/// Environment names cleared from every child.
const CLEARED_PREFIXES: &[&str] = &[
    "CUDA_",
    "LIBCUDA_LOG_LEVEL",
    "TESSERA_",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
];

fn prerequisites() -> bool {
    let unset = std::env::var_os("TESSERA_SIM_ROOT").is_none_or(|v| v.is_empty());
    let mut needs = vec![
        Need::condition(
            unset,
            "TESSERA_SIM_ROOT unset (the stand-ins would serve that node instead)",
            "unset TESSERA_SIM_ROOT",
        ),
        Need::absent(
            tessera_model::contract::vgpu::CONTAINER_CONFIG_PATH,
            "it would override the tenants' limits",
        ),
        Need::Built("libtessera_vgpu.so"),
        Need::Built("tessera-cuda-probe"),
        Need::Program("unshare"),
        Need::Root,
    ];
    needs.extend(SimNode::profile("h100-80gb").needs());
    require(&needs).is_ok()
}

/// A tenant: an allocation directory (binding record, accounting region),
/// its limits file, and its workload running in a pid namespace of its own.
struct Tenant {
    name: String,
    unshare: Child,
    /// The workload's pid in the host's pid namespace (init of its namespace).
    host_pid: u32,
}

/// Makes `<state>/alloc/<id>/accounting/vgpu.accounting` as the hook does
/// (directory 0755, empty file 0666) and the limits file naming it.
fn allocation(state: &Path, work: &Path, id: &str, uuid: &str) -> PathBuf {
    let dir = state.join(ALLOC_DIR).join(id);
    let accounting = dir.join(ACCOUNTING_SUBDIR);
    std::fs::create_dir_all(&accounting).expect("accounting dir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    std::fs::set_permissions(&accounting, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let region = accounting.join(ACCOUNTING_FILE);
    std::fs::write(&region, b"").expect("region file");
    std::fs::set_permissions(&region, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let limits = work.join(format!("{id}.json"));
    let text = format!(
        r#"{{"version": 1, "devices": [{{"uuid": "{uuid}", "smLimitPercent": {TARGET}}}], "accountingDir": "{}"}}"#,
        accounting.display()
    );
    std::fs::write(&limits, text).expect("limits file");
    limits
}

/// The binding record the hook would write for a container whose init is `pid`.
fn bind(state: &Path, id: &str, pid: u32) {
    let cgroup_text =
        std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("read the cgroup");
    let mut cgroups = std::collections::BTreeMap::new();
    for line in cgroup_text.lines() {
        let mut parts = line.splitn(3, ':');
        if let (Some(_), Some(ctrl), Some(path)) = (parts.next(), parts.next(), parts.next()) {
            cgroups.insert(ctrl.to_string(), path.to_string());
        }
    }
    let record = BindingRecord {
        alloc_id: id.to_string(),
        container_id: format!("container-{id}"),
        pid,
        cgroup: cgroups.get("").cloned().unwrap_or_default(),
        cgroups,
        bundle: "/nonexistent".into(),
        mode: "cdi".into(),
        bound_at: 1,
    };
    let path = state.join(ALLOC_DIR).join(id).join(BINDING_FILE);
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec(&record).expect("json")).expect("write binding");
    std::fs::rename(&tmp, &path).expect("rename binding");
}

/// The only child of `pid` (the workload `unshare --fork` started), waited for.
fn only_child(pid: u32) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        if let Some(child) = children.split_whitespace().next() {
            return child.parse().expect("a pid");
        }
        assert!(Instant::now() < deadline, "unshare {pid} started no child");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn start_tenant(sim: &SimNode, state: &Path, id: &str, uuid: &str, seed: u32) -> Tenant {
    let limits = allocation(state, sim.dir(), id, uuid);
    let mut cmd = Command::new("unshare");
    for (key, _) in std::env::vars_os() {
        let text = key.to_string_lossy();
        if CLEARED_PREFIXES.iter().any(|p| text.starts_with(p)) {
            cmd.env_remove(&key);
        }
    }
    cmd.args(["--pid", "--fork", "--kill-child"])
        .arg(artefact("tessera-cuda-probe"))
        .args([
            "--route",
            "proc",
            "launch",
            "--api",
            "launch",
            "--kernels",
            "10",
            "--blocks",
            "100,300,1000",
            "--seconds",
            RUN_SECONDS,
        ])
        .env("LD_LIBRARY_PATH", sim.lib_dir())
        .env("LD_PRELOAD", artefact("libtessera_vgpu.so"))
        .env("TESSERA_VGPU_CONFIG", &limits)
        // The sm_limit tests' device: 20 µs per launch, waves of 2 blocks
        // per SM, 10 % seeded noise.
        .env("TESSERA_SIM_CUDA_LAUNCH_NS", "20000")
        .env("TESSERA_SIM_CUDA_BLOCKS_PER_SM", "2")
        .env("TESSERA_SIM_CUDA_NOISE_PCT", "10")
        .env("TESSERA_SIM_CUDA_NOISE_SEED", seed.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let unshare = cmd.spawn().expect("run unshare");
    let host_pid = only_child(unshare.id());
    // Really in a namespace of its own.
    let ns = |pid: u32| std::fs::read_link(format!("/proc/{pid}/ns/pid")).expect("ns");
    assert_ne!(
        ns(host_pid),
        ns(std::process::id()),
        "not in its own pid namespace"
    );
    Tenant {
        name: id.to_string(),
        unshare,
        host_pid,
    }
}

/// Runs two tenants on a fresh node, with or without the monitor; each
/// tenant's percent of the device over the window.
fn run(with_monitor: bool) -> Vec<(String, f64, u32)> {
    let sim = SimNode::profile("h100-80gb")
        .stand_ins(&[StandIn::Nvml, StandIn::Cuda])
        .build()
        .expect("node (prerequisites checked)");
    let driver =
        Arc::new(NvmlDriver::load(&sim.library(StandIn::Nvml)).expect("load the NVML stand-in"));
    let uuid = driver.gpus().expect("gpus")[0].uuid.clone();
    let state = sim.dir().join("state");
    std::fs::create_dir_all(state.join(ALLOC_DIR)).expect("state dir");
    let stop = Arc::new(AtomicBool::new(false));
    let monitor = Arc::new(Monitor::with_config(
        MonitorConfig::new(&state),
        driver.clone(),
    ));
    let ticker = with_monitor.then(|| {
        let (monitor, stop) = (monitor.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                monitor.tick();
                std::thread::sleep(monitor.config().period);
            }
        })
    });
    let tenants: Vec<Tenant> = ["tenant-a-0", "tenant-b-0"]
        .iter()
        .zip([11, 12])
        .map(|(id, seed)| start_tenant(&sim, &state, id, &uuid, seed))
        .collect();
    for t in &tenants {
        bind(&state, &t.name, t.host_pid);
    }
    let device = DeviceTimeline::open_waiting(
        &timeline::path(sim.root(), 0, None),
        Duration::from_secs(10),
    )
    .unwrap_or_else(|e| panic!("no device timeline: {e}"));
    std::thread::sleep(WARMUP);
    let before = device.snapshot();
    std::thread::sleep(WINDOW);
    let after = device.snapshot();
    let snapshot = monitor.snapshot();
    stop.store(true, Ordering::Relaxed);
    if let Some(t) = ticker {
        t.join().expect("monitor thread");
    }
    let mut results = Vec::new();
    for t in tenants {
        let percent = 100.0 * timeline::busy_fraction(&before, &after, Some(&[t.host_pid]));
        let out = t.unshare.wait_with_output().expect("wait");
        assert!(
            out.status.success(),
            "{} failed: {}\n{}",
            t.name,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let published = snapshot
            .iter()
            .filter(|u| u.alloc_id == t.name && u.published)
            .count() as u32;
        results.push((t.name, percent, published));
    }
    eprintln!("with monitor: {with_monitor}: {results:?}; monitor's last pass: {snapshot:?}");
    results
}

#[test]
fn two_tenants_in_their_own_pid_namespaces_each_get_30_percent() {
    if !prerequisites() {
        return;
    }
    let control = std::thread::spawn(|| run(false));
    let monitored = run(true);
    let control = control.join().expect("control run");
    for (name, percent, published) in &monitored {
        assert!(
            (percent - TARGET).abs() <= 5.0,
            "{name} got {percent:.1} % of the device with the monitor (want 30 ± 5): {monitored:?}"
        );
        assert_eq!(*published, 1, "{name}: the monitor published its figure");
    }
    // The old behaviour, without the monitor: each library sees only the
    // whole device (both tenants) and throttles until that is 30 %, so the
    // pair together gets about one share (≈ 15 % each, split at random).
    let total: f64 = control.iter().map(|(_, p, _)| p).sum();
    let least = control.iter().map(|(_, p, _)| *p).fold(f64::MAX, f64::min);
    assert!(
        total < 2.0 * TARGET - 15.0 && least < TARGET - 5.0,
        "without the monitor the fallback should over-throttle (together about {TARGET} %): {control:?}"
    );
}
