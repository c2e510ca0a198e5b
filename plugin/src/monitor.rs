//! The node monitor: NVML's host pids → allocations, and each allocation's
//! SM utilization and memory (as NVML sees them) published into its
//! accounting region.
//!
//! # Why
//!
//! NVML reports host pids. A container with its own pid namespace knows its
//! processes by other pids, so the vGPU library's SM limiter cannot find them
//! in NVML's samples, and without help falls back to the whole device's
//! utilization (two busy tenants at 30 % each then end near 15 % each). The
//! monitor runs on the host, where the pids make sense.
//!
//! # A pass ([`Monitor::tick`], every [`PERIOD`])
//!
//! 1. The binding records the hook writes (`<state_dir>/alloc/<id>/binding.json`,
//!    [`BindingRecord`]) say which container holds which allocation: its init
//!    pid (host) and its cgroup.
//! 2. For each GPU: `GpuDriver::processes` (memory) and
//!    `GpuDriver::process_utilization` since the newest sample seen on that
//!    GPU (each pid's new samples averaged, as the library does).
//! 3. Each host pid is mapped to an allocation through `/proc` (a
//!    configurable root, for tests): the inode of `/proc/<pid>/ns/pid` equal
//!    to that of the binding's init pid (not usable when the init shares the
//!    host's pid namespace), else `/proc/<pid>/cgroup` at or under exactly
//!    one binding's cgroup (never `/`; a process in the host's pid namespace
//!    only to bindings whose init is there too).
//! 4. Per allocation and device: utilization summed, memory summed,
//!    processes counted; published into the device entry of the
//!    allocation's region whose uuid hash matches (the library claims
//!    entries; the monitor never does), stamped with `CLOCK_MONOTONIC` ms.
//!    An allocation none of whose processes NVML saw gets a fresh 0.
//!
//! A GPU whose utilization the driver cannot report (`NotSupported`, an
//! error), or that had processes but no new sample this pass, gets nothing
//! published: the library's figure then ages out (`vgpu_region::FRESH_MS`)
//! and it falls back to the whole device. Publishing a 0 there would let the
//! container run unthrottled.
//!
//! [`Monitor::snapshot`] is the last pass's figures, for metrics.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tessera_driver::{DriverError, GpuDriver};
use tessera_model::alloc::{AllocId, BindingRecord};
use tessera_model::contract::node::{ACCOUNTING_SUBDIR, ALLOC_DIR, BINDING_FILE};
use tessera_model::contract::vgpu::{ACCOUNTING_FILE, CONTAINER_CONFIG_PATH};
use tessera_model::vgpu::VgpuConfig;
use tessera_model::vgpu_region::{Published, permille_of_percent};

use crate::region::{MappedRegion, monotonic_ms};
use crate::run::NodeContext;

/// How often the monitor runs a pass (`vgpu_region::PUBLISH_PERIOD_MS`).
pub const PERIOD: Duration = Duration::from_millis(tessera_model::vgpu_region::PUBLISH_PERIOD_MS);

/// Largest binding record read.
const MAX_BINDING_BYTES: u64 = 64 * 1024;

/// Where the monitor looks.
#[derive(Debug, Clone)]
pub struct MonitorConfig {
    /// `--state-dir`: the allocation directories are under `<state_dir>/alloc`.
    pub state_dir: PathBuf,
    /// The host's `/proc` (tests point it elsewhere).
    pub proc_root: PathBuf,
    /// Time between passes.
    pub period: Duration,
}

impl MonitorConfig {
    /// The real `/proc`, the default period.
    pub fn new(state_dir: impl Into<PathBuf>) -> MonitorConfig {
        MonitorConfig {
            state_dir: state_dir.into(),
            proc_root: PathBuf::from("/proc"),
            period: PERIOD,
        }
    }
}

/// One allocation's use of one device, as the last pass saw it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AllocationUsage {
    /// The allocation.
    pub alloc_id: String,
    /// The device (`GPU-…`, or `MIG-…` for processes NVML places in a MIG instance).
    pub device_uuid: String,
    /// SM utilization of the allocation's processes, percent of the device.
    pub sm_percent: f64,
    /// Device memory of those processes as NVML reports it, bytes.
    pub nvml_memory_bytes: u64,
    /// How many of the allocation's processes NVML reported.
    pub processes: u32,
    /// Bytes the container's vGPU library has charged (its region); `None`
    /// when the region holds no entry for the device.
    pub region_used_bytes: Option<u64>,
    /// The memory limit, bytes, from the allocation's `vgpu.json` beside its
    /// binding record, if there is one and it limits the device.
    pub limit_bytes: Option<u64>,
    /// Whether the figures were published into the region this pass.
    pub published: bool,
}

/// What one pass did (for logs and tests).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TickReport {
    /// Binding records read.
    pub bindings: usize,
    /// Host pids NVML reported, over all GPUs.
    pub pids: usize,
    /// Of those, mapped to an allocation.
    pub mapped: usize,
    /// Device entries published into.
    pub published: usize,
    /// GPUs skipped: the driver could not report utilization.
    pub unsupported_gpus: usize,
}

/// The node monitor. Share it (`Arc`) between [`Monitor::run`] and metrics.
pub struct Monitor {
    config: MonitorConfig,
    driver: Arc<dyn GpuDriver + Send + Sync>,
    state: Mutex<State>,
    snapshot: Mutex<Vec<AllocationUsage>>,
}

#[derive(Debug, Default)]
struct State {
    /// Newest utilization sample seen per GPU index, µs.
    last_sample_us: HashMap<u32, u64>,
    /// Open regions by allocation id.
    regions: HashMap<String, Arc<MappedRegion>>,
    /// Whether the "cannot report utilization" warning was logged per GPU.
    warned: HashMap<u32, bool>,
}

/// A binding record with what the pass learned about it.
struct Bound {
    record: BindingRecord,
    dir: PathBuf,
    /// Inode of the init's pid namespace, when it is not the host's.
    pid_ns: Option<u64>,
    /// Whether the init runs in the host's pid namespace (`hostPID`).
    in_host_ns: bool,
}

/// Per allocation and device: (util %, memory bytes, processes).
type Sums = BTreeMap<(String, String), (f64, u64, u32)>;

impl std::fmt::Debug for Monitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Monitor")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Monitor {
    /// The running plugin's monitor: its `--state-dir`, the real `/proc`,
    /// its driver.
    pub fn new(ctx: Arc<NodeContext>) -> Arc<Monitor> {
        Arc::new(Monitor::with_config(
            MonitorConfig::new(ctx.config.state_dir.clone()),
            ctx.driver.clone(),
        ))
    }

    /// A monitor over `config` and `driver` (tests).
    pub fn with_config(config: MonitorConfig, driver: Arc<dyn GpuDriver + Send + Sync>) -> Monitor {
        Monitor {
            config,
            driver,
            state: Mutex::new(State::default()),
            snapshot: Mutex::new(Vec::new()),
        }
    }

    /// Runs a pass every period (on a blocking thread: the driver and
    /// `/proc` calls block) until `shutdown` turns true or its sender is gone.
    pub async fn run(self: Arc<Self>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let mut interval = tokio::time::interval(self.config.period);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = interval.tick() => {}
                changed = shutdown.changed() => {
                    if changed.is_err() || *shutdown.borrow() {
                        return;
                    }
                    continue;
                }
            }
            if *shutdown.borrow() {
                return;
            }
            let m = self.clone();
            if let Err(e) = tokio::task::spawn_blocking(move || m.tick()).await {
                tracing::error!(error = %e, "node monitor pass panicked");
            }
        }
    }

    /// The configuration.
    pub fn config(&self) -> &MonitorConfig {
        &self.config
    }

    /// The last pass's figures, one entry per allocation and device it
    /// found (every device entry of every bound allocation's region, and
    /// every device NVML showed the allocation's processes on).
    pub fn snapshot(&self) -> Vec<AllocationUsage> {
        self.snapshot
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// One pass: read the bindings, ask the driver, map, publish.
    pub fn tick(&self) -> TickReport {
        let driver = self.driver.as_ref();
        let mut report = TickReport::default();
        let host_ns = ns_inode(&self.config.proc_root, 1);
        let bindings = self.read_bindings(host_ns);
        report.bindings = bindings.len();
        let gpus = match driver.gpus() {
            Ok(gpus) => gpus,
            Err(e) => {
                tracing::warn!(error = %e, "node monitor: cannot list GPUs");
                return report;
            }
        };
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let mut owners: HashMap<u32, Option<usize>> = HashMap::new();
        let mut sums: Sums = BTreeMap::new();
        // Devices whose figures may be published this pass.
        let mut publishable: Vec<String> = Vec::new();
        for gpu in &gpus {
            let processes = driver.processes(gpu.index);
            let since = state.last_sample_us.get(&gpu.index).copied().unwrap_or(0);
            let samples = match driver.process_utilization(gpu.index, since) {
                Ok(samples) => samples,
                Err(e) => {
                    report.unsupported_gpus += 1;
                    let warned = state.warned.entry(gpu.index).or_insert(false);
                    if !*warned {
                        *warned = true;
                        let level_info = matches!(e, DriverError::NotSupported(_));
                        if level_info {
                            tracing::info!(gpu = gpu.index, error = %e, "node monitor: no per-process utilization; SM limits in pid namespaces fall back to the whole device");
                        } else {
                            tracing::warn!(gpu = gpu.index, error = %e, "node monitor: cannot read per-process utilization");
                        }
                    }
                    continue;
                }
            };
            let newest = samples.iter().map(|s| s.timestamp_us).max().unwrap_or(0);
            state.last_sample_us.insert(gpu.index, newest.max(since));
            let processes = processes.unwrap_or_default();
            let mig = if processes.iter().any(|p| p.instance.is_some()) {
                driver.mig_devices(gpu.index).unwrap_or_default()
            } else {
                Vec::new()
            };
            let device_of = |pid: u32| -> String {
                processes
                    .iter()
                    .find(|p| p.pid == pid)
                    .and_then(|p| p.instance)
                    .and_then(|(gi, ci)| {
                        mig.iter()
                            .find(|m| m.gpu_instance_id == gi && m.compute_instance_id == ci)
                    })
                    .map_or_else(|| gpu.uuid.clone(), |m| m.uuid.clone())
            };
            // Each pid's new samples, averaged (NVML may return several).
            let mut per_pid: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
            for s in samples.iter().filter(|s| s.timestamp_us > since) {
                let e = per_pid.entry(s.pid).or_default();
                e.0 += u64::from(s.sm_percent);
                e.1 += 1;
            }
            let mut pids: Vec<u32> = per_pid.keys().copied().collect();
            pids.extend(processes.iter().map(|p| p.pid));
            pids.sort_unstable();
            pids.dedup();
            report.pids += pids.len();
            // Processes but no new sample: no measurement this pass.
            if !per_pid.is_empty() || processes.is_empty() {
                publishable.push(gpu.uuid.to_ascii_lowercase());
                publishable.extend(mig.iter().map(|m| m.uuid.to_ascii_lowercase()));
            }
            for pid in pids {
                let owner = *owners
                    .entry(pid)
                    .or_insert_with(|| owner_of(&self.config.proc_root, pid, host_ns, &bindings));
                let Some(owner) = owner else { continue };
                report.mapped += 1;
                let util = per_pid
                    .get(&pid)
                    .map_or(0.0, |&(sum, n)| sum as f64 / n.max(1) as f64);
                let memory = processes
                    .iter()
                    .find(|p| p.pid == pid)
                    .map_or(0, |p| p.used_memory_bytes);
                let key = (bindings[owner].record.alloc_id.clone(), device_of(pid));
                let e = sums.entry(key).or_insert((0.0, 0, 0));
                e.0 += util;
                e.1 += memory;
                e.2 += 1;
            }
        }
        let now_ms = monotonic_ms();
        let mut snapshot = Vec::new();
        let live: Vec<String> = bindings.iter().map(|b| b.record.alloc_id.clone()).collect();
        state.regions.retain(|id, _| live.contains(id));
        for bound in &bindings {
            let id = &bound.record.alloc_id;
            let region = region_for(&mut state.regions, id, &bound.dir);
            let limits = read_limits(&bound.dir);
            let mut devices: Vec<String> = gpus.iter().map(|g| g.uuid.clone()).collect();
            devices.extend(sums.keys().filter(|(a, _)| a == id).map(|(_, d)| d.clone()));
            devices.sort();
            devices.dedup();
            let intact = region.as_ref().is_some_and(|r| r.intact());
            for uuid in devices {
                let (util, memory, processes) = sums
                    .get(&(id.clone(), uuid.clone()))
                    .copied()
                    .unwrap_or((0.0, 0, 0));
                let index = region
                    .as_ref()
                    .filter(|_| intact)
                    .and_then(|r| r.device_index(&uuid));
                if index.is_none() && processes == 0 {
                    // Neither the library nor NVML knows the pair.
                    continue;
                }
                let mut published = false;
                let mut region_used = None;
                if let (Some(r), Some(i)) = (region.as_ref(), index) {
                    region_used = Some(r.used(i));
                    if publishable.contains(&uuid.to_ascii_lowercase()) {
                        r.publish(
                            i,
                            &Published {
                                sm_permille: permille_of_percent(util),
                                processes,
                                at_ms: now_ms,
                                nvml_used: memory,
                            },
                        );
                        published = true;
                        report.published += 1;
                    }
                }
                snapshot.push(AllocationUsage {
                    alloc_id: id.clone(),
                    device_uuid: uuid.clone(),
                    sm_percent: util,
                    nvml_memory_bytes: memory,
                    processes,
                    region_used_bytes: region_used,
                    limit_bytes: limits.get(&uuid.to_ascii_lowercase()).copied(),
                    published,
                });
            }
        }
        drop(state);
        *self.snapshot.lock().unwrap_or_else(PoisonError::into_inner) = snapshot;
        tracing::trace!(?report, "node monitor pass");
        report
    }

    /// Reads every binding record under `<state_dir>/alloc` (records that do
    /// not parse, or name another allocation than their directory, are skipped).
    fn read_bindings(&self, host_ns: Option<u64>) -> Vec<Bound> {
        let alloc = self.config.state_dir.join(ALLOC_DIR);
        let Ok(entries) = std::fs::read_dir(&alloc) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if AllocId::new(name).is_err() {
                continue;
            }
            let dir = entry.path();
            let Some(record) = read_binding(&dir.join(BINDING_FILE)) else {
                continue;
            };
            if record.alloc_id != name {
                tracing::debug!(dir = %dir.display(), "binding record names another allocation; skipped");
                continue;
            }
            let ns = ns_inode(&self.config.proc_root, record.pid);
            let in_host_ns = ns.is_some() && ns == host_ns;
            out.push(Bound {
                record,
                dir,
                pid_ns: ns.filter(|_| !in_host_ns),
                in_host_ns,
            });
        }
        out.sort_by(|a, b| a.record.alloc_id.cmp(&b.record.alloc_id));
        out
    }
}

fn read_binding(path: &Path) -> Option<BindingRecord> {
    use std::io::Read;
    let file = std::fs::File::open(path).ok()?;
    let mut raw = Vec::new();
    file.take(MAX_BINDING_BYTES).read_to_end(&mut raw).ok()?;
    serde_json::from_slice(&raw).ok()
}

/// The memory limits (bytes, by lowercase uuid) of the allocation's
/// `vgpu.json` beside its binding record, if there is one.
fn read_limits(dir: &Path) -> HashMap<String, u64> {
    let name = Path::new(CONTAINER_CONFIG_PATH)
        .file_name()
        .unwrap_or_default();
    let Ok(text) = std::fs::read_to_string(dir.join(name)) else {
        return HashMap::new();
    };
    let Ok(config) = VgpuConfig::parse(&text) else {
        return HashMap::new();
    };
    config
        .devices
        .iter()
        .filter(|d| d.memory_limit_mib > 0)
        .map(|d| {
            (
                d.uuid.to_ascii_lowercase(),
                d.memory_limit_mib * tessera_model::vgpu::MIB,
            )
        })
        .collect()
}

fn region_for(
    regions: &mut HashMap<String, Arc<MappedRegion>>,
    id: &str,
    dir: &Path,
) -> Option<Arc<MappedRegion>> {
    let path = dir.join(ACCOUNTING_SUBDIR).join(ACCOUNTING_FILE);
    if let Some(region) = regions.get(id) {
        let same =
            std::fs::symlink_metadata(&path).is_ok_and(|m| (m.dev(), m.ino()) == region.dev_ino());
        if same && region.intact() {
            return Some(region.clone());
        }
        regions.remove(id);
    }
    match MappedRegion::open(&path) {
        Ok(Some(region)) => {
            let region = Arc::new(region);
            regions.insert(id.to_string(), region.clone());
            Some(region)
        }
        Ok(None) => None,
        Err(e) => {
            tracing::debug!(error = %e, "node monitor: region not mapped");
            None
        }
    }
}

/// Inode of `<proc>/<pid>/ns/pid` (the pid namespace's identity).
fn ns_inode(proc_root: &Path, pid: u32) -> Option<u64> {
    std::fs::metadata(proc_root.join(pid.to_string()).join("ns/pid"))
        .ok()
        .map(|m| m.ino())
}

/// The cgroup paths of `<proc>/<pid>/cgroup`: the v2 line's first, then the rest.
fn cgroups_of(proc_root: &Path, pid: u32) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(proc_root.join(pid.to_string()).join("cgroup")) else {
        return Vec::new();
    };
    let mut v2 = Vec::new();
    let mut v1 = Vec::new();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(h), Some(_), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if h == "0" {
            v2.push(path.to_string());
        } else {
            v1.push(path.to_string());
        }
    }
    v2.extend(v1);
    v2
}

/// The binding (index into `bindings`) that host pid `pid` belongs to: the
/// one whose init shares its pid namespace, else the one whose cgroup it is
/// in. A process in the host's pid namespace is matched by cgroup only to
/// bindings whose init is there too (`hostPID` containers): a container
/// with a pid namespace of its own has no processes outside it.
fn owner_of(proc_root: &Path, pid: u32, host_ns: Option<u64>, bindings: &[Bound]) -> Option<usize> {
    let ns = ns_inode(proc_root, pid);
    if let Some(ns) = ns {
        let by_ns: Vec<usize> = (0..bindings.len())
            .filter(|&i| bindings[i].pid_ns == Some(ns))
            .collect();
        if let [one] = by_ns[..] {
            return Some(one);
        }
    }
    let in_host_ns = ns.is_some() && ns == host_ns;
    let candidates: Vec<usize> = (0..bindings.len())
        .filter(|&i| !in_host_ns || bindings[i].in_host_ns)
        .collect();
    for path in &cgroups_of(proc_root, pid) {
        let cgroups = candidates
            .iter()
            .map(|&i| bindings[i].record.cgroup.as_str());
        if let Some(k) = match_cgroup(path, cgroups) {
            return Some(candidates[k]);
        }
    }
    None
}

/// The one binding cgroup `path` is at or under (the deepest; `/` and empty
/// never match; two bindings with the deepest path: none).
fn match_cgroup<'a>(path: &str, cgroups: impl Iterator<Item = &'a str>) -> Option<usize> {
    let mut best: Option<(usize, usize)> = None;
    let mut tie = false;
    for (i, cg) in cgroups.enumerate() {
        let cg = cg.trim_end_matches('/');
        if cg.is_empty() {
            continue;
        }
        let under = path == cg
            || path
                .strip_prefix(cg)
                .is_some_and(|rest| rest.starts_with('/'));
        if !under {
            continue;
        }
        match best {
            Some((_, len)) if len > cg.len() => {}
            Some((_, len)) if len == cg.len() => tie = true,
            _ => {
                best = Some((i, cg.len()));
                tie = false;
            }
        }
    }
    if tie { None } else { best.map(|(i, _)| i) }
}

#[cfg(test)]
mod tests {
    use tessera_driver::fake::{FakeDriver, FakeGpu};
    use tessera_driver::{GpuProcess, ProcessUtilization};
    use tessera_model::vgpu_region;

    use super::*;

    const UUID: &str = "GPU-aaaa";

    /// A `/proc` of its own: `<pid>/ns/pid` hard links of one file per
    /// namespace (same inode: same namespace), `<pid>/cgroup`.
    struct FakeProc {
        root: PathBuf,
    }

    impl FakeProc {
        fn process(&self, pid: u32, ns: &str, cgroup: &str) {
            let dir = self.root.join(pid.to_string());
            std::fs::create_dir_all(dir.join("ns")).expect("proc dir");
            let ns_file = self.root.join(format!("ns-{ns}"));
            if !ns_file.exists() {
                std::fs::write(&ns_file, ns).expect("ns file");
            }
            std::fs::hard_link(&ns_file, dir.join("ns/pid")).expect("link ns");
            std::fs::write(dir.join("cgroup"), format!("0::{cgroup}\n")).expect("cgroup");
        }
    }

    /// An allocation directory with a binding record and, with `region`, a
    /// region file as the library leaves it (GPU `UUID` claimed in entry 2).
    fn allocation(state: &Path, id: &str, pid: u32, cgroup: &str, region: bool) -> PathBuf {
        let dir = state.join(ALLOC_DIR).join(id);
        std::fs::create_dir_all(dir.join(ACCOUNTING_SUBDIR)).expect("dirs");
        let record = BindingRecord {
            alloc_id: id.to_string(),
            container_id: format!("c-{id}"),
            pid,
            cgroup: cgroup.to_string(),
            cgroups: BTreeMap::from([(String::new(), cgroup.to_string())]),
            bundle: "/b".into(),
            mode: "cdi".into(),
            bound_at: 1,
        };
        std::fs::write(
            dir.join(BINDING_FILE),
            serde_json::to_vec(&record).expect("json"),
        )
        .expect("binding");
        let path = dir.join(ACCOUNTING_SUBDIR).join(ACCOUNTING_FILE);
        if region {
            let mut bytes = vec![0u8; vgpu_region::SIZE];
            bytes[..8].copy_from_slice(&vgpu_region::MAGIC.to_le_bytes());
            bytes[8..12].copy_from_slice(&vgpu_region::LAYOUT_VERSION.to_le_bytes());
            bytes[16..24].copy_from_slice(&(vgpu_region::SIZE as u64).to_le_bytes());
            let entry = vgpu_region::device_offset(2);
            let hash = vgpu_region::uuid_hash(UUID).expect("uuid");
            bytes[entry..entry + 8].copy_from_slice(&hash.to_le_bytes());
            bytes[entry + 8..entry + 16].copy_from_slice(&777u64.to_le_bytes());
            std::fs::write(&path, bytes).expect("region");
        } else {
            std::fs::write(&path, b"").expect("empty region");
        }
        path
    }

    fn published(path: &Path) -> Published {
        MappedRegion::open(path)
            .expect("open")
            .expect("region")
            .published(2)
    }

    fn proc_(pid: u32, gib: u64) -> GpuProcess {
        GpuProcess {
            pid,
            used_memory_bytes: gib << 30,
            instance: None,
        }
    }

    fn sample(pid: u32, sm_percent: u32, timestamp_us: u64) -> ProcessUtilization {
        ProcessUtilization {
            pid,
            sm_percent,
            timestamp_us,
        }
    }

    #[test]
    fn host_pids_are_mapped_by_pid_namespace_or_cgroup_and_published() {
        let dir = tempfile::tempdir().expect("dir");
        let fake = FakeProc {
            root: dir.path().join("proc"),
        };
        let state = dir.path().join("state");
        // Host init; tenant a (two processes, a pid namespace of its own,
        // the host's cgroup); tenant b (another namespace); tenant c shares
        // the host's pid namespace and is found by its cgroup; pid 999 is
        // nobody's.
        fake.process(1, "host", "/");
        fake.process(100, "a", "/shared");
        fake.process(101, "a", "/shared");
        fake.process(300, "b", "/kubepods/pod-b/c2");
        fake.process(401, "host", "/kubepods/pod-c/c3");
        fake.process(402, "host", "/kubepods/pod-c/c3/worker");
        fake.process(999, "host", "/shared");
        let a = allocation(&state, "pod-a-0", 100, "/shared", true);
        let b = allocation(&state, "pod-b-0", 300, "/kubepods/pod-b/c2", true);
        let c = allocation(&state, "pod-c-0", 401, "/kubepods/pod-c/c3", true);
        allocation(&state, "pod-d-0", 555, "/gone", false);
        let driver = Arc::new(
            FakeDriver::new().with_gpu(FakeGpu::plain(0, "NVIDIA H100", 81_559).with_uuid(UUID)),
        );
        driver.set_processes(
            0,
            vec![
                proc_(100, 1),
                proc_(101, 2),
                proc_(300, 4),
                proc_(402, 1),
                proc_(999, 8),
            ],
        );
        driver.set_process_utilization(
            0,
            vec![
                sample(100, 20, 10),
                sample(100, 30, 20),
                sample(101, 10, 15),
                sample(300, 40, 12),
                sample(402, 5, 11),
                sample(999, 50, 19),
            ],
        );
        let monitor = Monitor::with_config(
            MonitorConfig {
                state_dir: state.clone(),
                proc_root: fake.root.clone(),
                period: PERIOD,
            },
            driver.clone(),
        );
        let before = monotonic_ms();
        let report = monitor.tick();
        assert_eq!(
            report,
            TickReport {
                bindings: 4,
                pids: 5,
                mapped: 4,
                published: 3,
                unsupported_gpus: 0
            }
        );
        let pa = published(&a);
        assert_eq!(
            (pa.sm_permille, pa.processes, pa.nvml_used),
            (350, 2, 3 << 30),
            "pid 100's samples averaged, plus pid 101"
        );
        assert!(pa.is_fresh(before) && pa.at_ms >= before);
        let pb = published(&b);
        assert_eq!(
            (pb.sm_permille, pb.processes, pb.nvml_used),
            (400, 1, 4 << 30)
        );
        let pc = published(&c);
        assert_eq!(
            (pc.sm_permille, pc.processes, pc.nvml_used),
            (50, 1, 1 << 30),
            "by cgroup, under the binding's"
        );
        let snap = monitor.snapshot();
        assert_eq!(snap.len(), 3, "{snap:?}");
        let sa = snap.iter().find(|u| u.alloc_id == "pod-a-0").expect("a");
        assert_eq!(sa.device_uuid, UUID);
        assert!((sa.sm_percent - 35.0).abs() < 1e-9);
        assert_eq!(sa.region_used_bytes, Some(777));
        assert!(sa.published);

        // Processes but no new sample: nothing is published (the stamp stays).
        std::thread::sleep(Duration::from_millis(5));
        monitor.tick();
        assert_eq!(
            published(&a).at_ms,
            pa.at_ms,
            "no new sample: not republished"
        );

        // The driver cannot report utilization: nothing published either.
        driver.fail_next(
            "process_utilization",
            DriverError::NotSupported("test".into()),
        );
        let report = monitor.tick();
        assert_eq!((report.unsupported_gpus, report.published), (1, 0));
        assert_eq!(published(&a).at_ms, pa.at_ms);

        // Every process gone: a fresh zero for everyone.
        driver.set_processes(0, Vec::new());
        monitor.tick();
        let zero = published(&a);
        assert_eq!(
            (zero.sm_permille, zero.processes, zero.nvml_used),
            (0, 0, 0)
        );
        assert!(zero.at_ms > pa.at_ms);
    }

    #[test]
    fn cgroups_match_at_or_under_one_binding_never_the_root() {
        let cgs = ["/kubepods/pod-a/c1", "/kubepods/pod-b/c2", "/", ""];
        let m = |p: &str| match_cgroup(p, cgs.iter().copied());
        assert_eq!(m("/kubepods/pod-a/c1"), Some(0));
        assert_eq!(m("/kubepods/pod-a/c1/sub"), Some(0));
        assert_eq!(
            m("/kubepods/pod-a/c10"),
            None,
            "a sibling with a longer name"
        );
        assert_eq!(m("/kubepods/pod-b/c2"), Some(1));
        assert_eq!(m("/system.slice/x"), None, "'/' matches nothing");
        let tied = ["/k/a", "/k/a"];
        assert_eq!(match_cgroup("/k/a/x", tied.iter().copied()), None);
        let nested = ["/k", "/k/a"];
        assert_eq!(match_cgroup("/k/a/x", nested.iter().copied()), Some(1));
    }
}
