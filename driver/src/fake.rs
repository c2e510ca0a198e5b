//! [`FakeDriver`]: an in-memory [`GpuDriver`] for unit tests of its callers.
//!
//! Built step by step (GPUs with their profiles and placements, taken from the
//! model catalogue with [`FakeGpu::of_model`]; pre-existing instances), it applies the MIG rules that matter to callers, simply:
//!
//! - an unknown GPU, GI or CI → [`DriverError::NotFound`];
//! - an unknown profile id, or a placement that is not one of the profile's legal
//!   placements → [`DriverError::InvalidArgument`];
//! - a placement overlapping an existing GI, a profile already at its instance
//!   count, a second CI in a GI → [`DriverError::InsufficientResources`];
//! - destroying a GI that still holds CIs → [`DriverError::InUse`];
//! - creating a GI on a GPU whose MIG mode is off → [`DriverError::Call`].
//!
//! GI ids are driver-assigned (the lowest free id from 1), never the placement
//! start; MIG uuids change when an instance is re-created, as on real GPUs.
//!
//! Every trait call is recorded, in the form `name(arg, …)` — e.g.
//! `create_gpu_instance(0, 9, 4+4)` (placement as `start+size`) or
//! `destroy_compute_instance(0, 2, 0)` — so tests can assert what was called
//! ([`FakeDriver::calls`]). [`FakeDriver::fail_next`] makes the next call of a
//! method fail with a chosen error.
//!
//! Health and processes are scripted: [`FakeDriver::push_health_event`]
//! queues an event for `wait_health_event` (waking a waiting caller);
//! [`FakeDriver::set_lost`] makes a GPU fall off the bus as NVML reports it —
//! one [`HealthEvent::Lost`] queued, and every call naming the GPU (and
//! `gpus`) failing with [`DriverError::GpuLost`] until it is restored;
//! [`FakeDriver::set_processes`] and [`FakeDriver::set_process_utilization`]
//! give what `processes` and `process_utilization` report (nothing by
//! default; utilization samples only when newer than the caller's
//! `since_us`, as NVML filters them).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tessera_model::gpu::{
    ComputeInstance, GpuInfo, GpuInstance, GpuInstanceProfileInfo, MigDevice, MigModeState,
};
use tessera_model::mig::Placement;
use tessera_model::mig::catalogue::{self, GiProfileSpec, GpuModelSpec};

use crate::{DriverError, GpuDriver, GpuProcess, HealthEvent, ProcessUtilization};

/// A GPU-instance profile of a fake GPU with its legal placements.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeProfile {
    /// The profile as `gpu_instance_profiles` reports it.
    pub info: GpuInstanceProfileInfo,
    /// Its legal placements, as `possible_placements` reports them.
    pub placements: Vec<Placement>,
}

/// One GPU of a [`FakeDriver`]: what `gpus` reports and the MIG profiles it offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeGpu {
    /// What `gpus` reports.
    pub info: GpuInfo,
    /// Profiles, in enum order.
    pub profiles: Vec<FakeProfile>,
}

impl FakeGpu {
    /// A GPU with no MIG profiles.
    pub fn new(info: GpuInfo) -> Self {
        Self {
            info,
            profiles: Vec::new(),
        }
    }

    /// A GPU without MIG support: minor = index, uuid derived from the index.
    pub fn plain(index: u32, name: &str, memory_mib: u64) -> Self {
        Self::new(GpuInfo {
            index,
            minor: index,
            uuid: format!("GPU-{index:08x}-0000-4000-8000-00000000f00d"),
            name: name.to_string(),
            memory_mib,
            mig: None,
        })
    }

    /// A GPU of a model from the catalogue ([`catalogue::find`]): its product
    /// name and memory and, for a MIG-capable model, MIG enabled with the
    /// catalogue's GPU-instance profiles (in NVML enum order) and their legal
    /// placements. Minor = index, uuid derived from the index.
    pub fn of_model(index: u32, model: &GpuModelSpec) -> Self {
        let mut gpu = Self::plain(index, model.product_name, model.memory_mib);
        if let Some(mig) = model.mig {
            gpu = gpu.with_mig_enabled(true);
            let mut profiles: Vec<&GiProfileSpec> = mig.profiles.iter().collect();
            profiles.sort_by_key(|p| p.enum_index);
            for p in profiles {
                gpu = gpu.with_profile(profile_info(p), p.placements().collect());
            }
        }
        gpu
    }

    /// An A100-SXM4-40GB from the catalogue (ids 19, 14, 9, 5, 0, 20, 15 in enum
    /// order; an axis of 8 memory slices) with MIG enabled; minor = index.
    pub fn a100_40gb(index: u32) -> Self {
        let model = catalogue::find("A100-40GB").expect("the catalogue holds the A100-40GB");
        Self::of_model(index, model)
            .with_uuid(&format!("GPU-a100{index:04x}-0000-4000-8000-000000000000"))
    }

    /// Adds a profile with its legal placements.
    pub fn with_profile(
        mut self,
        info: GpuInstanceProfileInfo,
        placements: Vec<Placement>,
    ) -> Self {
        self.profiles.push(FakeProfile { info, placements });
        self
    }

    /// Sets the minor number (`/dev/nvidia<minor>`), which need not equal the index.
    pub fn with_minor(mut self, minor: u32) -> Self {
        self.info.minor = minor;
        self
    }

    /// Sets the uuid.
    pub fn with_uuid(mut self, uuid: &str) -> Self {
        self.info.uuid = uuid.to_string();
        self
    }

    /// Sets the current (and pending) MIG mode; the GPU then reports MIG support.
    pub fn with_mig_enabled(mut self, enabled: bool) -> Self {
        self.info.mig = Some(MigModeState {
            current: enabled,
            pending: enabled,
        });
        self
    }
}

#[derive(Debug)]
struct FakeCi {
    ci: ComputeInstance,
    uuid: String,
}

#[derive(Debug)]
struct FakeGi {
    gi: GpuInstance,
    profile: GpuInstanceProfileInfo,
    cis: Vec<FakeCi>,
}

#[derive(Debug)]
struct GpuState {
    gpu: FakeGpu,
    gis: Vec<FakeGi>,
}

#[derive(Debug, Default)]
struct State {
    driver_version: String,
    gpus: Vec<GpuState>,
    calls: Vec<String>,
    failures: Vec<(String, DriverError)>,
    serial: u64,
    health: VecDeque<HealthEvent>,
    lost: BTreeSet<u32>,
    processes: BTreeMap<u32, Vec<GpuProcess>>,
    utilization: BTreeMap<u32, Vec<ProcessUtilization>>,
    /// Per GPU: device memory used, bytes, and utilization, percent.
    usage: BTreeMap<u32, (u64, u32)>,
}

/// An in-memory GPU driver that records its calls. See the [module docs](self).
#[derive(Debug)]
pub struct FakeDriver {
    state: Mutex<State>,
    /// Signalled when a health event is queued.
    health_queued: Condvar,
}

impl Default for FakeDriver {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeDriver {
    /// A driver with no GPUs and version `550.54.14`.
    pub fn new() -> Self {
        Self {
            state: Mutex::new(State {
                driver_version: "550.54.14".to_string(),
                ..State::default()
            }),
            health_queued: Condvar::new(),
        }
    }

    /// Sets the driver version.
    pub fn with_driver_version(self, version: &str) -> Self {
        self.lock().driver_version = version.to_string();
        self
    }

    /// Adds a GPU; GPUs are reported in index order.
    pub fn with_gpu(self, gpu: FakeGpu) -> Self {
        {
            let mut state = self.lock();
            state.gpus.push(GpuState {
                gpu,
                gis: Vec::new(),
            });
            state.gpus.sort_by_key(|g| g.gpu.info.index);
        }
        self
    }

    /// Adds an existing MIG device: a GI of `profile_id` at `placement` with its
    /// whole-GI CI. Not recorded as a call.
    ///
    /// # Panics
    /// When the MIG rules refuse the instance: this is test setup.
    pub fn with_mig_device(self, gpu: u32, profile_id: u32, placement: Placement) -> Self {
        {
            let mut state = self.lock();
            let gi = state
                .create_gi(gpu, profile_id, placement)
                .unwrap_or_else(|e| panic!("FakeDriver::with_mig_device: {e}"));
            if let Err(e) = state.create_ci(gpu, gi.id) {
                panic!("FakeDriver::with_mig_device: {e}");
            }
        }
        self
    }

    /// Adds an existing GI without a CI. Not recorded as a call.
    ///
    /// # Panics
    /// When the MIG rules refuse the instance: this is test setup.
    pub fn with_gpu_instance(self, gpu: u32, profile_id: u32, placement: Placement) -> Self {
        if let Err(e) = self.lock().create_gi(gpu, profile_id, placement) {
            panic!("FakeDriver::with_gpu_instance: {e}");
        }
        self
    }

    /// Makes the next call of trait method `method` (e.g. `"create_gpu_instance"`)
    /// fail with `error` (the call is still recorded). Queued failures of the same
    /// method are used in order.
    pub fn fail_next(&self, method: &str, error: DriverError) {
        self.lock().failures.push((method.to_string(), error));
    }

    /// Queues `event` for `wait_health_event` (and wakes a waiting caller).
    pub fn push_health_event(&self, event: HealthEvent) {
        self.lock().health.push_back(event);
        self.health_queued.notify_all();
    }

    /// Marks GPU `gpu` lost (queueing one [`HealthEvent::Lost`] when it was
    /// answering) or, with `lost` false, answering again.
    ///
    /// # Panics
    /// When the driver has no GPU `gpu`: this is test setup.
    pub fn set_lost(&self, gpu: u32, lost: bool) {
        let mut state = self.lock();
        let uuid = match state.gpus.iter().find(|g| g.gpu.info.index == gpu) {
            Some(g) => g.gpu.info.uuid.clone(),
            None => panic!("FakeDriver::set_lost: no GPU {gpu}"),
        };
        if !lost {
            state.lost.remove(&gpu);
            return;
        }
        if state.lost.insert(gpu) {
            state.health.push_back(HealthEvent::Lost { uuid });
            drop(state);
            self.health_queued.notify_all();
        }
    }

    /// What `processes(gpu)` reports from now on.
    pub fn set_processes(&self, gpu: u32, processes: Vec<GpuProcess>) {
        self.lock().processes.insert(gpu, processes);
    }

    /// The samples `process_utilization(gpu, since_us)` picks from (those
    /// with `timestamp_us > since_us`) from now on.
    pub fn set_process_utilization(&self, gpu: u32, samples: Vec<ProcessUtilization>) {
        self.lock().utilization.insert(gpu, samples);
    }

    /// What `memory_info(gpu)` reports as used (the total is the GPU's
    /// memory) and `utilization(gpu)` as the GPU's utilization from now on;
    /// both report 0 until set.
    pub fn set_usage(&self, gpu: u32, used_bytes: u64, percent: u32) {
        self.lock().usage.insert(gpu, (used_bytes, percent));
    }

    /// The calls made so far, oldest first, in the form `name(arg, …)`.
    pub fn calls(&self) -> Vec<String> {
        self.lock().calls.clone()
    }

    /// Forgets the recorded calls.
    pub fn clear_calls(&self) {
        self.lock().calls.clear();
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a call and returns the state, or the queued failure for it.
    fn call(&self, method: &str, args: String) -> Result<MutexGuard<'_, State>, DriverError> {
        let mut state = self.lock();
        state.calls.push(format!("{method}({args})"));
        if let Some(i) = state.failures.iter().position(|(m, _)| m == method) {
            return Err(state.failures.remove(i).1);
        }
        Ok(state)
    }
}

/// A catalogue profile as the driver reports it.
pub fn profile_info(profile: &GiProfileSpec) -> GpuInstanceProfileInfo {
    GpuInstanceProfileInfo {
        id: profile.id,
        enum_index: profile.enum_index,
        name: profile.name.to_string(),
        slice_count: profile.compute_slices,
        memory_mib: profile.memory_mib,
        multiprocessor_count: profile.sm_count,
        instance_count: profile.max_instances,
    }
}

fn overlaps(a: Placement, b: Placement) -> bool {
    a.start < b.start + b.size && b.start < a.start + a.size
}

impl State {
    fn gpu(&self, gpu: u32) -> Result<&GpuState, DriverError> {
        let found = self
            .gpus
            .iter()
            .find(|g| g.gpu.info.index == gpu)
            .ok_or_else(|| DriverError::NotFound(format!("GPU {gpu} does not exist")))?;
        self.answering(gpu)?;
        Ok(found)
    }

    /// `GpuLost` for a GPU marked lost.
    fn answering(&self, gpu: u32) -> Result<(), DriverError> {
        if self.lost.contains(&gpu) {
            return Err(DriverError::GpuLost(format!(
                "GPU {gpu} has fallen off the bus"
            )));
        }
        Ok(())
    }

    fn gpu_mut(&mut self, gpu: u32) -> Result<&mut GpuState, DriverError> {
        self.answering(gpu)?;
        self.gpus
            .iter_mut()
            .find(|g| g.gpu.info.index == gpu)
            .ok_or_else(|| DriverError::NotFound(format!("GPU {gpu} does not exist")))
    }

    fn profile(&self, gpu: u32, profile_id: u32) -> Result<&FakeProfile, DriverError> {
        self.gpu(gpu)?
            .gpu
            .profiles
            .iter()
            .find(|p| p.info.id == profile_id)
            .ok_or_else(|| {
                DriverError::InvalidArgument(format!(
                    "GPU {gpu} has no GPU-instance profile with id {profile_id}"
                ))
            })
    }

    fn create_gi(
        &mut self,
        gpu: u32,
        profile_id: u32,
        placement: Placement,
    ) -> Result<GpuInstance, DriverError> {
        let state = self.gpu(gpu)?;
        if !state.gpu.info.mig_enabled() {
            return Err(DriverError::Call {
                call: "nvmlDeviceCreateGpuInstanceWithPlacement",
                reason: format!("GPU {gpu}: MIG mode is disabled"),
            });
        }
        let profile = self.profile(gpu, profile_id)?.clone();
        if !profile.placements.contains(&placement) {
            return Err(DriverError::InvalidArgument(format!(
                "GPU {gpu}: placement {}+{} is not legal for profile {} (id {profile_id})",
                placement.start, placement.size, profile.info.name
            )));
        }
        if let Some(other) = state
            .gis
            .iter()
            .find(|g| overlaps(g.gi.placement, placement))
        {
            return Err(DriverError::InsufficientResources(format!(
                "GPU {gpu}: placement {}+{} overlaps GPU instance {} at {}+{}",
                placement.start,
                placement.size,
                other.gi.id,
                other.gi.placement.start,
                other.gi.placement.size
            )));
        }
        let existing = state
            .gis
            .iter()
            .filter(|g| g.gi.profile_id == profile_id)
            .count();
        if existing >= profile.info.instance_count as usize {
            return Err(DriverError::InsufficientResources(format!(
                "GPU {gpu}: profile {} already has its {} instances",
                profile.info.name, profile.info.instance_count
            )));
        }
        let id = (1..)
            .find(|id| state.gis.iter().all(|g| g.gi.id != *id))
            .unwrap_or(u32::MAX);
        let gi = GpuInstance {
            gpu_index: gpu,
            id,
            profile_id,
            placement,
        };
        self.gpu_mut(gpu)?.gis.push(FakeGi {
            gi,
            profile: profile.info,
            cis: Vec::new(),
        });
        Ok(gi)
    }

    fn gi_mut(&mut self, gpu: u32, gi: u32) -> Result<&mut FakeGi, DriverError> {
        self.gpu_mut(gpu)?
            .gis
            .iter_mut()
            .find(|g| g.gi.id == gi)
            .ok_or_else(|| DriverError::NotFound(format!("GPU {gpu} has no GPU instance {gi}")))
    }

    fn create_ci(&mut self, gpu: u32, gi_id: u32) -> Result<ComputeInstance, DriverError> {
        self.serial += 1;
        let serial = self.serial;
        let gi = self.gi_mut(gpu, gi_id)?;
        if !gi.cis.is_empty() {
            return Err(DriverError::InsufficientResources(format!(
                "GPU {gpu}, GPU instance {gi_id}: already holds a compute instance spanning it"
            )));
        }
        let ci = ComputeInstance {
            gpu_index: gpu,
            gpu_instance_id: gi_id,
            id: 0,
            profile_id: catalogue::whole_ci_profile(gi.profile.slice_count)
                .unwrap_or(gi.profile.slice_count),
        };
        gi.cis.push(FakeCi {
            ci,
            uuid: format!(
                "MIG-{serial:08x}-{gpu:04x}-{gi_id:04x}-{:04x}-000000000000",
                ci.id
            ),
        });
        Ok(ci)
    }
}

impl GpuDriver for FakeDriver {
    fn driver_version(&self) -> Result<String, DriverError> {
        Ok(self
            .call("driver_version", String::new())?
            .driver_version
            .clone())
    }

    fn gpus(&self) -> Result<Vec<GpuInfo>, DriverError> {
        let state = self.call("gpus", String::new())?;
        if let Some(&gpu) = state.lost.first() {
            state.answering(gpu)?;
        }
        Ok(state.gpus.iter().map(|g| g.gpu.info.clone()).collect())
    }

    fn gpu_instance_profiles(&self, gpu: u32) -> Result<Vec<GpuInstanceProfileInfo>, DriverError> {
        let state = self.call("gpu_instance_profiles", format!("{gpu}"))?;
        Ok(state
            .gpu(gpu)?
            .gpu
            .profiles
            .iter()
            .map(|p| p.info.clone())
            .collect())
    }

    fn possible_placements(
        &self,
        gpu: u32,
        profile_id: u32,
    ) -> Result<Vec<Placement>, DriverError> {
        let state = self.call("possible_placements", format!("{gpu}, {profile_id}"))?;
        Ok(state.profile(gpu, profile_id)?.placements.clone())
    }

    fn gpu_instances(&self, gpu: u32) -> Result<Vec<GpuInstance>, DriverError> {
        let state = self.call("gpu_instances", format!("{gpu}"))?;
        let mut gis: Vec<GpuInstance> = state.gpu(gpu)?.gis.iter().map(|g| g.gi).collect();
        gis.sort_by_key(|g| g.id);
        Ok(gis)
    }

    fn create_gpu_instance(
        &self,
        gpu: u32,
        profile_id: u32,
        placement: Placement,
    ) -> Result<GpuInstance, DriverError> {
        let args = format!(
            "{gpu}, {profile_id}, {}+{}",
            placement.start, placement.size
        );
        self.call("create_gpu_instance", args)?
            .create_gi(gpu, profile_id, placement)
    }

    fn destroy_gpu_instance(&self, gpu: u32, gpu_instance_id: u32) -> Result<(), DriverError> {
        let mut state = self.call("destroy_gpu_instance", format!("{gpu}, {gpu_instance_id}"))?;
        let gi = state.gi_mut(gpu, gpu_instance_id)?;
        if !gi.cis.is_empty() {
            return Err(DriverError::InUse(format!(
                "GPU {gpu}, GPU instance {gpu_instance_id}: still holds {} compute instance(s)",
                gi.cis.len()
            )));
        }
        state
            .gpu_mut(gpu)?
            .gis
            .retain(|g| g.gi.id != gpu_instance_id);
        Ok(())
    }

    fn compute_instances(
        &self,
        gpu: u32,
        gpu_instance_id: u32,
    ) -> Result<Vec<ComputeInstance>, DriverError> {
        let mut state = self.call("compute_instances", format!("{gpu}, {gpu_instance_id}"))?;
        Ok(state
            .gi_mut(gpu, gpu_instance_id)?
            .cis
            .iter()
            .map(|c| c.ci)
            .collect())
    }

    fn create_compute_instance(
        &self,
        gpu: u32,
        gpu_instance_id: u32,
    ) -> Result<ComputeInstance, DriverError> {
        self.call(
            "create_compute_instance",
            format!("{gpu}, {gpu_instance_id}"),
        )?
        .create_ci(gpu, gpu_instance_id)
    }

    fn destroy_compute_instance(
        &self,
        gpu: u32,
        gpu_instance_id: u32,
        compute_instance_id: u32,
    ) -> Result<(), DriverError> {
        let mut state = self.call(
            "destroy_compute_instance",
            format!("{gpu}, {gpu_instance_id}, {compute_instance_id}"),
        )?;
        let gi = state.gi_mut(gpu, gpu_instance_id)?;
        let before = gi.cis.len();
        gi.cis.retain(|c| c.ci.id != compute_instance_id);
        if gi.cis.len() == before {
            return Err(DriverError::NotFound(format!(
                "GPU {gpu}, GPU instance {gpu_instance_id} has no compute instance {compute_instance_id}"
            )));
        }
        Ok(())
    }

    fn wait_health_event(&self, timeout: Duration) -> Result<Option<HealthEvent>, DriverError> {
        let now = Instant::now();
        let deadline = now
            .checked_add(timeout)
            .unwrap_or_else(|| now + Duration::from_secs(86_400));
        let mut state = self.call("wait_health_event", format!("{}ms", timeout.as_millis()))?;
        loop {
            if let Some(event) = state.health.pop_front() {
                return Ok(Some(event));
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Ok(None);
            }
            state = self
                .health_queued
                .wait_timeout(state, remaining)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn check_gpu(&self, gpu: u32) -> Result<(), DriverError> {
        self.call("check_gpu", format!("{gpu}"))?
            .gpu(gpu)
            .map(|_| ())
    }

    fn processes(&self, gpu: u32) -> Result<Vec<GpuProcess>, DriverError> {
        let state = self.call("processes", format!("{gpu}"))?;
        state.gpu(gpu)?;
        Ok(state.processes.get(&gpu).cloned().unwrap_or_default())
    }

    fn process_utilization(
        &self,
        gpu: u32,
        since_us: u64,
    ) -> Result<Vec<ProcessUtilization>, DriverError> {
        let state = self.call("process_utilization", format!("{gpu}, {since_us}"))?;
        state.gpu(gpu)?;
        Ok(state
            .utilization
            .get(&gpu)
            .map(|all| {
                all.iter()
                    .filter(|s| s.timestamp_us > since_us)
                    .copied()
                    .collect()
            })
            .unwrap_or_default())
    }

    fn memory_info(&self, gpu: u32) -> Result<(u64, u64), DriverError> {
        let state = self.call("memory_info", format!("{gpu}"))?;
        let total = state.gpu(gpu)?.gpu.info.memory_mib << 20;
        let used = state.usage.get(&gpu).map_or(0, |u| u.0);
        Ok((used, total))
    }

    fn utilization(&self, gpu: u32) -> Result<u32, DriverError> {
        let state = self.call("utilization", format!("{gpu}"))?;
        state.gpu(gpu)?;
        Ok(state.usage.get(&gpu).map_or(0, |u| u.1))
    }

    fn mig_devices(&self, gpu: u32) -> Result<Vec<MigDevice>, DriverError> {
        let state = self.call("mig_devices", format!("{gpu}"))?;
        let g = state.gpu(gpu)?;
        if !g.gpu.info.mig_enabled() {
            return Ok(Vec::new());
        }
        let mut gis: Vec<&FakeGi> = g.gis.iter().collect();
        gis.sort_by_key(|gi| gi.gi.id);
        let mut out = Vec::new();
        for gi in gis {
            for ci in &gi.cis {
                out.push(MigDevice {
                    parent_index: gpu,
                    mig_index: out.len() as u32,
                    gpu_instance_id: gi.gi.id,
                    compute_instance_id: ci.ci.id,
                    profile: gi.profile.name.clone(),
                    placement: gi.gi.placement,
                    uuid: ci.uuid.clone(),
                    memory_mib: gi.profile.memory_mib,
                });
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(start: u32, size: u32) -> Placement {
        Placement { start, size }
    }

    fn a100() -> FakeDriver {
        FakeDriver::new().with_gpu(FakeGpu::a100_40gb(0))
    }

    #[test]
    fn reports_gpus_profiles_and_placements() {
        let d = a100().with_gpu(FakeGpu::plain(1, "NVIDIA T4", 15360));
        let gpus = d.gpus().unwrap();
        assert_eq!(gpus.len(), 2);
        assert!(gpus[0].mig_enabled());
        assert!(!gpus[1].mig_enabled());
        let ids: Vec<u32> = d
            .gpu_instance_profiles(0)
            .unwrap()
            .iter()
            .map(|p| p.id)
            .collect();
        assert_eq!(ids, [19, 14, 9, 5, 0, 20, 15]);
        assert_eq!(d.possible_placements(0, 9).unwrap(), [p(0, 4), p(4, 4)]);
        assert!(matches!(
            d.possible_placements(0, 42),
            Err(DriverError::InvalidArgument(_))
        ));
        assert!(matches!(
            d.gpu_instance_profiles(7),
            Err(DriverError::NotFound(_))
        ));
    }

    #[test]
    fn catalogue_gpus_report_the_catalogue_profiles() {
        let a100 = FakeGpu::a100_40gb(0);
        assert_eq!(a100.info.name, "NVIDIA A100-SXM4-40GB");
        assert_eq!(a100.info.memory_mib, 40960);
        let seven = a100.profiles.iter().find(|p| p.info.id == 0).unwrap();
        assert_eq!(seven.info.name, "7g.40gb");
        assert_eq!(seven.info.memory_mib, 40448, "the catalogue's figure");
        assert_eq!(seven.placements, [p(0, 8)]);

        let a30 = FakeGpu::of_model(1, catalogue::find("A30").unwrap());
        let ids: Vec<u32> = a30.profiles.iter().map(|p| p.info.id).collect();
        assert_eq!(ids, [14, 5, 0, 21, 6], "NVML enum order");
        assert!(a30.info.mig_enabled());
    }

    #[test]
    fn create_list_and_destroy_follow_the_mig_rules() {
        let d = a100();
        let gi = d.create_gpu_instance(0, 9, p(4, 4)).unwrap();
        assert_ne!(
            gi.id, 4,
            "GI ids are driver-assigned, not the placement start"
        );
        assert!(matches!(
            d.create_gpu_instance(0, 14, p(4, 2)),
            Err(DriverError::InsufficientResources(_))
        ));
        assert!(matches!(
            d.create_gpu_instance(0, 9, p(2, 4)),
            Err(DriverError::InvalidArgument(_))
        ));
        assert!(matches!(
            d.create_gpu_instance(0, 99, p(0, 1)),
            Err(DriverError::InvalidArgument(_))
        ));
        let ci = d.create_compute_instance(0, gi.id).unwrap();
        assert_eq!(ci.profile_id, 2, "3-slice GI gets the 3-slice CI profile");
        assert!(matches!(
            d.create_compute_instance(0, gi.id),
            Err(DriverError::InsufficientResources(_))
        ));
        assert_eq!(d.compute_instances(0, gi.id).unwrap(), [ci]);
        assert_eq!(d.gpu_instances(0).unwrap(), [gi]);

        assert!(matches!(
            d.destroy_gpu_instance(0, gi.id),
            Err(DriverError::InUse(_))
        ));
        d.destroy_compute_instance(0, gi.id, ci.id).unwrap();
        assert!(matches!(
            d.destroy_compute_instance(0, gi.id, ci.id),
            Err(DriverError::NotFound(_))
        ));
        d.destroy_gpu_instance(0, gi.id).unwrap();
        assert!(d.gpu_instances(0).unwrap().is_empty());
        assert!(matches!(
            d.destroy_gpu_instance(0, gi.id),
            Err(DriverError::NotFound(_))
        ));
    }

    #[test]
    fn instance_count_limits_creation() {
        let d = a100();
        d.create_gpu_instance(0, 20, p(0, 1)).unwrap();
        assert!(matches!(
            d.create_gpu_instance(0, 20, p(1, 1)),
            Err(DriverError::InsufficientResources(_))
        ));
    }

    #[test]
    fn mig_devices_list_gi_ci_pairs_with_mig_uuids() {
        let d = a100()
            .with_mig_device(0, 19, p(6, 1))
            .with_mig_device(0, 9, p(0, 4))
            .with_gpu_instance(0, 14, p(4, 2));
        let devices = d.mig_devices(0).unwrap();
        assert_eq!(devices.len(), 2, "a GI without CI is no MIG device");
        assert_eq!(devices[0].profile, "1g.5gb");
        assert_eq!(devices[0].placement, p(6, 1));
        assert_eq!(devices[1].profile, "3g.20gb");
        assert_eq!(devices[1].mig_index, 1);
        assert!(devices.iter().all(|m| m.uuid.starts_with("MIG-")));
        assert_ne!(devices[0].uuid, devices[1].uuid);
        assert_eq!(d.calls(), ["mig_devices(0)"], "setup is not recorded");
    }

    #[test]
    fn mig_off_means_no_instances() {
        let d = FakeDriver::new().with_gpu(FakeGpu::a100_40gb(0).with_mig_enabled(false));
        assert!(matches!(
            d.create_gpu_instance(0, 19, p(0, 1)),
            Err(DriverError::Call { .. })
        ));
        assert!(d.mig_devices(0).unwrap().is_empty());
    }

    #[test]
    fn calls_are_recorded_and_failures_injected() {
        let d = a100();
        d.fail_next(
            "create_gpu_instance",
            DriverError::InsufficientResources("injected".into()),
        );
        let err = d.create_gpu_instance(0, 0, p(0, 8)).unwrap_err();
        assert_eq!(err.to_string(), "injected");
        let gi = d.create_gpu_instance(0, 0, p(0, 8)).unwrap();
        d.create_compute_instance(0, gi.id).unwrap();
        d.destroy_compute_instance(0, gi.id, 0).unwrap();
        d.destroy_gpu_instance(0, gi.id).unwrap();
        assert_eq!(
            d.calls(),
            [
                "create_gpu_instance(0, 0, 0+8)",
                "create_gpu_instance(0, 0, 0+8)",
                "create_compute_instance(0, 1)",
                "destroy_compute_instance(0, 1, 0)",
                "destroy_gpu_instance(0, 1)",
            ]
        );
        d.clear_calls();
        assert!(d.calls().is_empty());
    }

    #[test]
    fn recreated_instances_get_new_mig_uuids() {
        let d = a100();
        let gi = d.create_gpu_instance(0, 19, p(0, 1)).unwrap();
        d.create_compute_instance(0, gi.id).unwrap();
        let first = d.mig_devices(0).unwrap()[0].uuid.clone();
        d.destroy_compute_instance(0, gi.id, 0).unwrap();
        d.create_compute_instance(0, gi.id).unwrap();
        assert_ne!(d.mig_devices(0).unwrap()[0].uuid, first);
    }

    #[test]
    fn health_events_are_scripted_and_wake_a_waiter() {
        let driver = std::sync::Arc::new(a100());
        assert_eq!(
            driver.wait_health_event(Duration::from_millis(10)).unwrap(),
            None
        );
        let xid = HealthEvent::Xid {
            uuid: "GPU-x".into(),
            xid: 79,
            instance: Some((1, 0)),
        };
        let waiter = {
            let driver = driver.clone();
            std::thread::spawn(move || driver.wait_health_event(Duration::from_secs(10)))
        };
        std::thread::sleep(Duration::from_millis(50));
        let started = Instant::now();
        driver.push_health_event(xid.clone());
        assert_eq!(waiter.join().unwrap().unwrap(), Some(xid));
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(
            driver
                .calls()
                .contains(&"wait_health_event(10ms)".to_string())
        );
    }

    #[test]
    fn a_lost_gpu_reports_once_and_fails_until_restored() {
        let driver = a100();
        let uuid = driver.gpus().unwrap()[0].uuid.clone();
        driver.set_lost(0, true);
        driver.set_lost(0, true);
        assert_eq!(
            driver.wait_health_event(Duration::ZERO).unwrap(),
            Some(HealthEvent::Lost { uuid })
        );
        assert_eq!(driver.wait_health_event(Duration::ZERO).unwrap(), None);
        assert!(matches!(driver.check_gpu(0), Err(DriverError::GpuLost(_))));
        assert!(matches!(driver.gpus(), Err(DriverError::GpuLost(_))));
        assert!(matches!(driver.processes(0), Err(DriverError::GpuLost(_))));
        assert!(matches!(
            driver.create_gpu_instance(0, 9, p(0, 4)),
            Err(DriverError::GpuLost(_))
        ));
        driver.set_lost(0, false);
        driver.check_gpu(0).unwrap();
        assert!(matches!(driver.check_gpu(7), Err(DriverError::NotFound(_))));
    }

    #[test]
    fn processes_and_utilization_are_scripted() {
        let driver = a100();
        assert_eq!(driver.processes(0).unwrap(), []);
        let p1 = GpuProcess {
            pid: 42,
            used_memory_bytes: 1 << 20,
            instance: Some((2, 0)),
        };
        driver.set_processes(0, vec![p1.clone()]);
        assert_eq!(driver.processes(0).unwrap(), [p1]);
        let sample = |pid, timestamp_us| ProcessUtilization {
            pid,
            sm_percent: 30,
            timestamp_us,
        };
        driver.set_process_utilization(0, vec![sample(42, 100), sample(43, 200)]);
        assert_eq!(
            driver.process_utilization(0, 150).unwrap(),
            [sample(43, 200)]
        );
        assert_eq!(driver.process_utilization(0, 0).unwrap().len(), 2);
        assert!(
            driver
                .calls()
                .contains(&"process_utilization(0, 150)".to_string())
        );
    }

    #[test]
    fn whole_gpu_memory_and_utilization_are_scripted() {
        let driver = a100();
        let total = driver.gpus().unwrap()[0].memory_mib << 20;
        assert!(total > 0);
        assert_eq!(driver.memory_info(0).unwrap(), (0, total));
        assert_eq!(driver.utilization(0).unwrap(), 0);
        driver.set_usage(0, 3 << 30, 75);
        assert_eq!(driver.memory_info(0).unwrap(), (3 << 30, total));
        assert_eq!(driver.utilization(0).unwrap(), 75);
        assert!(matches!(
            driver.memory_info(5),
            Err(DriverError::NotFound(_))
        ));
        driver.set_lost(0, true);
        assert!(matches!(
            driver.utilization(0),
            Err(DriverError::GpuLost(_))
        ));
    }
}
