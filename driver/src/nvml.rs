//! [`NvmlDriver`]: the [`GpuDriver`] over NVML, loaded at run time from an explicit
//! library path (the host's `libnvidia-ml.so.1`, or the simulated node's stand-in).
//!
//! Whole-GPU facts (count, uuid, name, minor, memory, MIG mode) come from
//! `nvml-wrapper`'s safe API. Everything MIG-specific goes through the raw calls in
//! `nvml_raw`: the safe profile query uses the unversioned struct (no name), its
//! `possible_placements` returns an empty list, and GI/CI management has no safe
//! wrapper at all.
//!
//! Health: [`GpuDriver::wait_health_event`] lazily makes one NVML event set
//! registered for XID critical errors on every GPU that supports them, and on
//! each call also asks every GPU a cheap question (its memory), turning
//! `NVML_ERROR_GPU_IS_LOST` into [`HealthEvent::Lost`] once per GPU until it
//! answers again. NVML's `GPU_IS_LOST` becomes [`DriverError::GpuLost`]
//! wherever errors are mapped.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Display;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use tessera_model::gpu::{
    ComputeInstance, GpuInfo, GpuInstance, GpuInstanceProfileInfo, MigDevice, MigModeState,
};
use tessera_model::mig::Placement;

use crate::nvml_raw::{self, RawCiInfo, RawError, RawEventSet, RawGiInfo};
use crate::{DriverError, GpuDriver, GpuProcess, HealthEvent, ProcessUtilization};

const MIB: u64 = 1024 * 1024;

/// The GPU driver over NVML.
///
/// Holds the loaded library for its whole life; NVML is shut down when it is
/// dropped. Every method may be called from several threads at once (NVML is
/// thread-safe); [`GpuDriver::wait_health_event`] callers wait one at a time.
pub struct NvmlDriver {
    nvml: Nvml,
    lib_path: PathBuf,
    /// UUIDs of the GPUs seen by `gpus`, by index: a GPU lost later can
    /// no longer tell its own.
    uuids: Mutex<BTreeMap<u32, String>>,
    /// What `wait_health_event` watches (made on its first call).
    health: Mutex<Option<HealthWatch>>,
}

/// How long a wait pauses when NVML keeps answering `GPU_IS_LOST` for the
/// event set with no newly lost GPU to report.
const LOST_RETRY: Duration = Duration::from_millis(100);

/// The GPUs `wait_health_event` watches and what it has to report.
#[derive(Debug, Default)]
struct HealthWatch {
    /// The XID event set; `None` when the library has none to give.
    events: Option<RawEventSet>,
    /// Watched GPUs: index → (uuid, device key while it answered).
    gpus: BTreeMap<u32, (String, Option<usize>)>,
    /// GPUs reported lost and not answering since.
    lost: BTreeSet<u32>,
    /// Events found but not returned yet.
    pending: VecDeque<HealthEvent>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Drop for NvmlDriver {
    fn drop(&mut self) {
        // The event set must go back before `nvml` shuts the library down.
        let watch = self
            .health
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(set) = watch.and_then(|w| w.events)
            && let Err(e) = nvml_raw::event_set_free(&self.nvml, set)
        {
            tracing::debug!("{}: {}", e.call, e.reason);
        }
    }
}

impl std::fmt::Debug for NvmlDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlDriver")
            .field("lib_path", &self.lib_path)
            .finish_non_exhaustive()
    }
}

impl NvmlDriver {
    /// Loads NVML from `lib_path` (e.g. the result of
    /// [`devices::find_nvml_library`](crate::devices::find_nvml_library)) and
    /// initialises it.
    pub fn load(lib_path: &Path) -> Result<Self, DriverError> {
        let nvml = Nvml::builder()
            .lib_path(lib_path.as_os_str())
            .init()
            .map_err(|e| DriverError::Load {
                path: lib_path.display().to_string(),
                reason: e.to_string(),
            })?;
        Ok(Self {
            nvml,
            lib_path: lib_path.to_path_buf(),
            uuids: Mutex::new(BTreeMap::new()),
            health: Mutex::new(None),
        })
    }

    /// The library this driver was loaded from.
    pub fn lib_path(&self) -> &Path {
        &self.lib_path
    }

    fn device(&self, gpu: u32) -> Result<Device<'_>, DriverError> {
        self.nvml.device_by_index(gpu).map_err(|e| match e {
            NvmlError::InvalidArg | NvmlError::NotFound => {
                DriverError::NotFound(format!("GPU {gpu} does not exist"))
            }
            other => safe_error("nvmlDeviceGetHandleByIndex_v2", other, format!("gpu {gpu}")),
        })
    }

    /// Registers `device` (GPU `gpu`) for XID events in `set`, when it can
    /// report them; failures are logged, not fatal (the GPU is still checked
    /// for loss).
    fn register_xids(&self, set: &RawEventSet, device: &Device<'_>, gpu: u32) {
        let supported = match nvml_raw::supported_event_types(&self.nvml, device) {
            Ok(types) => types,
            Err(e) => {
                tracing::debug!(gpu, "{}: {}", e.call, e.reason);
                return;
            }
        };
        if supported & nvml_raw::EVENT_TYPE_XID_CRITICAL_ERROR == 0 {
            tracing::debug!(gpu, "the GPU reports no XID events");
            return;
        }
        if let Err(e) = nvml_raw::register_events(
            &self.nvml,
            device,
            nvml_raw::EVENT_TYPE_XID_CRITICAL_ERROR,
            set,
        ) {
            tracing::warn!(gpu, "{}: {}", e.call, e.reason);
        }
    }

    /// Makes the health watch: the event set and every GPU, registered.
    fn start_watch(&self) -> Result<HealthWatch, DriverError> {
        let count = self
            .nvml
            .device_count()
            .map_err(|e| safe_error("nvmlDeviceGetCount_v2", e, "system"))?;
        let mut watch = HealthWatch {
            events: match nvml_raw::event_set_create(&self.nvml) {
                Ok(set) => Some(set),
                Err(e) => {
                    tracing::warn!(
                        "{}: {}; XID errors will not be seen, lost GPUs still are",
                        e.call,
                        e.reason
                    );
                    None
                }
            },
            ..HealthWatch::default()
        };
        let known = lock(&self.uuids).clone();
        for index in 0..count {
            let device = match self.device(index) {
                Ok(device) => device,
                Err(DriverError::GpuLost(_)) => {
                    // Lost before we watched: reportable only if `gpus` saw it.
                    if let Some(uuid) = known.get(&index) {
                        watch.gpus.insert(index, (uuid.clone(), None));
                    }
                    continue;
                }
                Err(e) => return Err(e),
            };
            let uuid = match device.uuid() {
                Ok(uuid) => uuid,
                Err(NvmlError::GpuLost) => match known.get(&index) {
                    Some(uuid) => {
                        watch.gpus.insert(index, (uuid.clone(), None));
                        continue;
                    }
                    None => continue,
                },
                Err(e) => return Err(safe_error("nvmlDeviceGetUUID", e, format!("gpu {index}"))),
            };
            if let Some(set) = &watch.events {
                self.register_xids(set, &device, index);
            }
            watch
                .gpus
                .insert(index, (uuid, Some(nvml_raw::device_key(&device))));
        }
        Ok(watch)
    }

    /// Asks every watched GPU whether it answers: queues a `Lost` for each
    /// newly lost one; one that answers again is registered for XIDs anew.
    fn check_watched(&self, watch: &mut HealthWatch) {
        let indexes: Vec<u32> = watch.gpus.keys().copied().collect();
        for index in indexes {
            match self.check_gpu(index) {
                Err(DriverError::GpuLost(reason)) => {
                    if watch.lost.insert(index) {
                        tracing::warn!(gpu = index, "GPU lost: {reason}");
                        let uuid = watch.gpus[&index].0.clone();
                        watch.pending.push_back(HealthEvent::Lost { uuid });
                    }
                }
                Ok(()) => {
                    let back = watch.lost.remove(&index);
                    let unregistered = watch.gpus[&index].1.is_none();
                    if (back || unregistered)
                        && let Ok(device) = self.device(index)
                    {
                        if let Some(set) = &watch.events {
                            self.register_xids(set, &device, index);
                        }
                        if let Some(entry) = watch.gpus.get_mut(&index) {
                            entry.1 = Some(nvml_raw::device_key(&device));
                        }
                        tracing::info!(gpu = index, "GPU answers again");
                    }
                }
                Err(e) => tracing::debug!(gpu = index, "health check: {e}"),
            }
        }
    }

    /// The event a raw XID event stands for, if it names a watched GPU.
    fn xid_event(watch: &HealthWatch, raw: nvml_raw::RawEvent) -> Option<HealthEvent> {
        if raw.event_type & nvml_raw::EVENT_TYPE_XID_CRITICAL_ERROR == 0 {
            return None;
        }
        let Some((uuid, _)) = watch
            .gpus
            .values()
            .find(|(_, key)| *key == Some(raw.device))
        else {
            tracing::warn!(xid = raw.data, "XID on a GPU not watched");
            return None;
        };
        let none = nvml_raw::VALUE_NOT_AVAILABLE_UINT;
        let instance = (raw.gpu_instance_id != none && raw.compute_instance_id != none)
            .then_some((raw.gpu_instance_id, raw.compute_instance_id));
        Some(HealthEvent::Xid {
            uuid: uuid.clone(),
            xid: raw.data,
            instance,
        })
    }

    fn memory_mib(&self, device: &Device<'_>, gpu: u32) -> Result<u64, DriverError> {
        match device.memory_info() {
            Ok(m) => Ok(m.total / MIB),
            // Libraries without the v2 entry point: the unversioned one has the same total.
            Err(NvmlError::FailedToLoadSymbol(_) | NvmlError::FunctionNotFound) => {
                nvml_raw::memory_total_v1(&self.nvml, device)
                    .map(|b| b / MIB)
                    .map_err(|e| raw_error(e, format!("gpu {gpu}")))
            }
            Err(e) => Err(safe_error(
                "nvmlDeviceGetMemoryInfo_v2",
                e,
                format!("gpu {gpu}"),
            )),
        }
    }

    fn profiles(
        &self,
        device: &Device<'_>,
        gpu: u32,
    ) -> Result<Vec<GpuInstanceProfileInfo>, DriverError> {
        let gpu_memory_mib = self.memory_mib(device, gpu)?;
        let raw = nvml_raw::gi_profiles(&self.nvml, device)
            .map_err(|e| raw_error(e, format!("gpu {gpu}")))?;
        Ok(raw
            .into_iter()
            .map(|(enum_index, p)| {
                let name = match normalize_profile_name(&p.name) {
                    Some(name) => name,
                    None => {
                        derive_profile_name(enum_index, p.slice_count, p.memory_mib, gpu_memory_mib)
                    }
                };
                GpuInstanceProfileInfo {
                    id: p.id,
                    enum_index,
                    name,
                    slice_count: p.slice_count,
                    memory_mib: p.memory_mib,
                    multiprocessor_count: p.multiprocessor_count,
                    instance_count: p.instance_count,
                }
            })
            .collect())
    }
}

fn gi_from_raw(gpu: u32, gi: RawGiInfo) -> GpuInstance {
    GpuInstance {
        gpu_index: gpu,
        id: gi.id,
        profile_id: gi.profile_id,
        placement: Placement {
            start: gi.start,
            size: gi.size,
        },
    }
}

fn ci_from_raw(gpu: u32, gpu_instance_id: u32, ci: RawCiInfo) -> ComputeInstance {
    ComputeInstance {
        gpu_index: gpu,
        gpu_instance_id,
        id: ci.id,
        profile_id: ci.profile_id,
    }
}

/// Maps a raw NVML failure to a [`DriverError`], naming the call and what it was about.
fn raw_error(e: RawError, what: impl Display) -> DriverError {
    let message = format!("{} ({what}): {}", e.call, e.reason);
    match e.code {
        Some(nvml_raw::ERROR_INSUFFICIENT_RESOURCES) => DriverError::InsufficientResources(message),
        Some(nvml_raw::ERROR_INVALID_ARGUMENT) => DriverError::InvalidArgument(message),
        Some(nvml_raw::ERROR_NOT_FOUND) => DriverError::NotFound(message),
        Some(nvml_raw::ERROR_IN_USE) => DriverError::InUse(message),
        Some(nvml_raw::ERROR_GPU_IS_LOST) => DriverError::GpuLost(message),
        _ => DriverError::Call {
            call: e.call,
            reason: format!("{what}: {}", e.reason),
        },
    }
}

/// Maps an `nvml-wrapper` error the same way as [`raw_error`].
fn safe_error(call: &'static str, e: NvmlError, what: impl Display) -> DriverError {
    let message = format!("{call} ({what}): {e}");
    match e {
        NvmlError::InvalidArg => DriverError::InvalidArgument(message),
        NvmlError::NotFound => DriverError::NotFound(message),
        NvmlError::InUse => DriverError::InUse(message),
        NvmlError::GpuLost => DriverError::GpuLost(message),
        other => DriverError::Call {
            call,
            reason: format!("{what}: {other}"),
        },
    }
}

/// As [`safe_error`], but a call the GPU or library cannot answer at all
/// (`NOT_SUPPORTED`, a missing symbol) is [`DriverError::NotSupported`].
fn optional_error(call: &'static str, e: NvmlError, what: impl Display) -> DriverError {
    match e {
        NvmlError::NotSupported
        | NvmlError::FailedToLoadSymbol(_)
        | NvmlError::FunctionNotFound => DriverError::NotSupported(format!("{call} ({what}): {e}")),
        other => safe_error(call, other, what),
    }
}

/// The profile name NVML reports (`MIG 1g.10gb`) without its `MIG ` prefix, or
/// `None` when NVML reported none.
pub fn normalize_profile_name(nvml_name: &str) -> Option<String> {
    let name = nvml_name.trim();
    let name = match name.strip_prefix("MIG") {
        Some(rest) if rest.is_empty() || rest.starts_with(char::is_whitespace) => rest.trim(),
        _ => name,
    };
    (!name.is_empty()).then(|| name.to_string())
}

/// Derives a GPU-instance profile name (`1g.10gb`, `1g.5gb+me`) for drivers that
/// report none.
///
/// The memory part is computed the way NVIDIA's own tools name profiles: the
/// profile's share of the GPU's memory, rounded up to eighths, times the GPU's
/// memory in whole GiB (rounded up), rounded. A plain `round(GiB)` would call the
/// A100's 39.25 GiB `7g` profile `7g.39gb` instead of `7g.40gb`. When the GPU's
/// memory is unknown (0) the profile's own memory is rounded to GiB.
///
/// The suffix comes from the NVML profile enum: `+me` for the `*_REV1` profiles
/// (7, 8), `+gfx` for the `*_GFX` ones (0xA–0xC, 0x11), `-me` for `*_NO_ME` (0xD,
/// 0xE), `+me.all` for `*_ALL_ME` (0xF, 0x10).
pub fn derive_profile_name(
    enum_index: u32,
    slice_count: u32,
    memory_mib: u64,
    gpu_memory_mib: u64,
) -> String {
    let gb = if gpu_memory_mib == 0 {
        (memory_mib as f64 / 1024.0).round() as u64
    } else {
        let fraction = memory_mib as f64 / gpu_memory_mib as f64;
        let fraction = (fraction * 8.0).ceil() / 8.0;
        let gpu_gb = gpu_memory_mib.div_ceil(1024) as f64;
        (fraction * gpu_gb).round() as u64
    };
    let suffix = match enum_index {
        0x7 | 0x8 => "+me",
        0xA..=0xC | 0x11 => "+gfx",
        0xD | 0xE => "-me",
        0xF | 0x10 => "+me.all",
        _ => "",
    };
    format!("{slice_count}g.{gb}gb{suffix}")
}

impl GpuDriver for NvmlDriver {
    fn driver_version(&self) -> Result<String, DriverError> {
        self.nvml
            .sys_driver_version()
            .map_err(|e| safe_error("nvmlSystemGetDriverVersion", e, "system"))
    }

    fn gpus(&self) -> Result<Vec<GpuInfo>, DriverError> {
        let count = self
            .nvml
            .device_count()
            .map_err(|e| safe_error("nvmlDeviceGetCount_v2", e, "system"))?;
        let mut gpus = Vec::with_capacity(count as usize);
        for index in 0..count {
            let device = self.device(index)?;
            let what = || format!("gpu {index}");
            let uuid = device
                .uuid()
                .map_err(|e| safe_error("nvmlDeviceGetUUID", e, what()))?;
            let name = device
                .name()
                .map_err(|e| safe_error("nvmlDeviceGetName", e, what()))?;
            let minor = device
                .minor_number()
                .map_err(|e| safe_error("nvmlDeviceGetMinorNumber", e, what()))?;
            let memory_mib = self.memory_mib(&device, index)?;
            let mig = match device.mig_mode() {
                Ok(m) => Some(MigModeState {
                    current: m.current == 1,
                    pending: m.pending == 1,
                }),
                Err(
                    NvmlError::NotSupported
                    | NvmlError::FailedToLoadSymbol(_)
                    | NvmlError::FunctionNotFound,
                ) => None,
                Err(e) => return Err(safe_error("nvmlDeviceGetMigMode", e, what())),
            };
            lock(&self.uuids).insert(index, uuid.clone());
            gpus.push(GpuInfo {
                index,
                minor,
                uuid,
                name,
                memory_mib,
                mig,
            });
        }
        Ok(gpus)
    }

    fn gpu_instance_profiles(&self, gpu: u32) -> Result<Vec<GpuInstanceProfileInfo>, DriverError> {
        let device = self.device(gpu)?;
        self.profiles(&device, gpu)
    }

    fn possible_placements(
        &self,
        gpu: u32,
        profile_id: u32,
    ) -> Result<Vec<Placement>, DriverError> {
        let device = self.device(gpu)?;
        let placements = nvml_raw::possible_placements(&self.nvml, &device, profile_id)
            .map_err(|e| raw_error(e, format!("gpu {gpu}, profile id {profile_id}")))?;
        Ok(placements
            .into_iter()
            .map(|(start, size)| Placement { start, size })
            .collect())
    }

    fn gpu_instances(&self, gpu: u32) -> Result<Vec<GpuInstance>, DriverError> {
        let device = self.device(gpu)?;
        let mut seen = Vec::new();
        let mut out = Vec::new();
        for profile in self.profiles(&device, gpu)? {
            if seen.contains(&profile.id) {
                continue;
            }
            seen.push(profile.id);
            let gis =
                nvml_raw::gpu_instances(&self.nvml, &device, profile.id, profile.instance_count)
                    .map_err(|e| raw_error(e, format!("gpu {gpu}, profile id {}", profile.id)))?;
            out.extend(gis.into_iter().map(|gi| gi_from_raw(gpu, gi)));
        }
        out.sort_by_key(|gi| gi.id);
        Ok(out)
    }

    fn create_gpu_instance(
        &self,
        gpu: u32,
        profile_id: u32,
        placement: Placement,
    ) -> Result<GpuInstance, DriverError> {
        let device = self.device(gpu)?;
        let gi = nvml_raw::create_gpu_instance(
            &self.nvml,
            &device,
            profile_id,
            placement.start,
            placement.size,
        )
        .map_err(|e| {
            raw_error(
                e,
                format!(
                    "gpu {gpu}, profile id {profile_id}, placement {}+{}",
                    placement.start, placement.size
                ),
            )
        })?;
        Ok(gi_from_raw(gpu, gi))
    }

    fn destroy_gpu_instance(&self, gpu: u32, gpu_instance_id: u32) -> Result<(), DriverError> {
        let device = self.device(gpu)?;
        nvml_raw::destroy_gpu_instance(&self.nvml, &device, gpu_instance_id)
            .map_err(|e| raw_error(e, format!("gpu {gpu}, GPU instance {gpu_instance_id}")))
    }

    fn compute_instances(
        &self,
        gpu: u32,
        gpu_instance_id: u32,
    ) -> Result<Vec<ComputeInstance>, DriverError> {
        let device = self.device(gpu)?;
        let cis = nvml_raw::compute_instances(&self.nvml, &device, gpu_instance_id)
            .map_err(|e| raw_error(e, format!("gpu {gpu}, GPU instance {gpu_instance_id}")))?;
        Ok(cis
            .into_iter()
            .map(|ci| ci_from_raw(gpu, gpu_instance_id, ci))
            .collect())
    }

    fn create_compute_instance(
        &self,
        gpu: u32,
        gpu_instance_id: u32,
    ) -> Result<ComputeInstance, DriverError> {
        let device = self.device(gpu)?;
        let what = || format!("gpu {gpu}, GPU instance {gpu_instance_id}");
        let gi = nvml_raw::gpu_instance_by_id(&self.nvml, &device, gpu_instance_id)
            .map_err(|e| raw_error(e, what()))?;
        let gi_slices = self
            .profiles(&device, gpu)?
            .into_iter()
            .find(|p| p.id == gi.profile_id)
            .map(|p| p.slice_count)
            .ok_or_else(|| {
                DriverError::NotFound(format!(
                    "GPU {gpu} reports no GPU-instance profile with id {} (GPU instance {gpu_instance_id})",
                    gi.profile_id
                ))
            })?;
        // The CI that spans the whole GI: the CI profile with the GI's slice count
        // (the lowest enum wins, so the plain profile before the `REV1` one).
        let ci_profile = nvml_raw::ci_profiles(&self.nvml, &device, gpu_instance_id)
            .map_err(|e| raw_error(e, what()))?
            .into_iter()
            .filter(|p| p.slice_count == gi_slices)
            .min_by_key(|p| p.enum_index)
            .ok_or_else(|| {
                DriverError::NotFound(format!(
                    "GPU {gpu}, GPU instance {gpu_instance_id}: no compute-instance profile spans its {gi_slices} slices"
                ))
            })?;
        let ci =
            nvml_raw::create_compute_instance(&self.nvml, &device, gpu_instance_id, ci_profile.id)
                .map_err(|e| {
                    raw_error(e, format!("{}, CI profile id {}", what(), ci_profile.id))
                })?;
        Ok(ci_from_raw(gpu, gpu_instance_id, ci))
    }

    fn destroy_compute_instance(
        &self,
        gpu: u32,
        gpu_instance_id: u32,
        compute_instance_id: u32,
    ) -> Result<(), DriverError> {
        let device = self.device(gpu)?;
        nvml_raw::destroy_compute_instance(&self.nvml, &device, gpu_instance_id, compute_instance_id)
            .map_err(|e| {
                raw_error(
                    e,
                    format!(
                        "gpu {gpu}, GPU instance {gpu_instance_id}, compute instance {compute_instance_id}"
                    ),
                )
            })
    }

    fn wait_health_event(&self, timeout: Duration) -> Result<Option<HealthEvent>, DriverError> {
        let now = Instant::now();
        let deadline = now
            .checked_add(timeout)
            .unwrap_or_else(|| now + Duration::from_secs(86_400));
        let mut guard = lock(&self.health);
        if guard.is_none() {
            *guard = Some(self.start_watch()?);
        }
        let Some(watch) = guard.as_mut() else {
            return Ok(None);
        };
        self.check_watched(watch);
        loop {
            if let Some(event) = watch.pending.pop_front() {
                return Ok(Some(event));
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            let Some(set) = &watch.events else {
                std::thread::sleep(remaining);
                self.check_watched(watch);
                return Ok(watch.pending.pop_front());
            };
            // Whole milliseconds, rounded up so a short wait still waits.
            let ms = u32::try_from(remaining.as_micros().div_ceil(1000)).unwrap_or(u32::MAX);
            match nvml_raw::event_set_wait(&self.nvml, set, ms) {
                Ok(Some(raw)) => {
                    if let Some(event) = Self::xid_event(watch, raw) {
                        return Ok(Some(event));
                    }
                }
                Ok(None) => {
                    self.check_watched(watch);
                    return Ok(watch.pending.pop_front());
                }
                Err(e) if e.code == Some(nvml_raw::ERROR_GPU_IS_LOST) => {
                    self.check_watched(watch);
                    if watch.pending.is_empty() {
                        std::thread::sleep(LOST_RETRY.min(remaining));
                    }
                }
                Err(e) => return Err(raw_error(e, "XID event set")),
            }
            if watch.pending.is_empty() && Instant::now() >= deadline {
                return Ok(None);
            }
        }
    }

    fn check_gpu(&self, gpu: u32) -> Result<(), DriverError> {
        let device = self.device(gpu)?;
        self.memory_mib(&device, gpu).map(|_| ())
    }

    fn processes(&self, gpu: u32) -> Result<Vec<GpuProcess>, DriverError> {
        const CALL: &str = "nvmlDeviceGetComputeRunningProcesses_v3";
        let device = self.device(gpu)?;
        let list = device
            .running_compute_processes()
            .map_err(|e| optional_error(CALL, e, format!("gpu {gpu}")))?;
        Ok(list
            .into_iter()
            .map(|p| GpuProcess {
                pid: p.pid,
                used_memory_bytes: match p.used_gpu_memory {
                    UsedGpuMemory::Used(bytes) => bytes,
                    UsedGpuMemory::Unavailable => 0,
                },
                instance: p.gpu_instance_id.zip(p.compute_instance_id),
            })
            .collect())
    }

    fn process_utilization(
        &self,
        gpu: u32,
        since_us: u64,
    ) -> Result<Vec<ProcessUtilization>, DriverError> {
        const CALL: &str = "nvmlDeviceGetProcessUtilization";
        let device = self.device(gpu)?;
        let samples = match device.process_utilization_stats(since_us) {
            Ok(samples) => samples,
            // NVML's answer when no process ran since `since_us`.
            Err(NvmlError::NotFound) => Vec::new(),
            Err(e) => return Err(optional_error(CALL, e, format!("gpu {gpu}"))),
        };
        Ok(samples
            .into_iter()
            .map(|s| ProcessUtilization {
                pid: s.pid,
                sm_percent: s.sm_util,
                timestamp_us: s.timestamp,
            })
            .collect())
    }

    fn memory_info(&self, gpu: u32) -> Result<(u64, u64), DriverError> {
        const CALL: &str = "nvmlDeviceGetMemoryInfo_v2";
        let device = self.device(gpu)?;
        let memory = device
            .memory_info()
            .map_err(|e| optional_error(CALL, e, format!("gpu {gpu}")))?;
        Ok((memory.used, memory.total))
    }

    fn utilization(&self, gpu: u32) -> Result<u32, DriverError> {
        const CALL: &str = "nvmlDeviceGetUtilizationRates";
        let device = self.device(gpu)?;
        let rates = device
            .utilization_rates()
            .map_err(|e| optional_error(CALL, e, format!("gpu {gpu}")))?;
        Ok(rates.gpu)
    }

    fn mig_devices(&self, gpu: u32) -> Result<Vec<MigDevice>, DriverError> {
        let device = self.device(gpu)?;
        match device.mig_mode() {
            Ok(m) if m.current == 1 => {}
            Ok(_) | Err(NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_)) => {
                return Ok(Vec::new());
            }
            Err(e) => return Err(safe_error("nvmlDeviceGetMigMode", e, format!("gpu {gpu}"))),
        }
        let raw = nvml_raw::mig_devices(&self.nvml, &device)
            .map_err(|e| raw_error(e, format!("gpu {gpu}")))?;
        if raw.is_empty() {
            return Ok(Vec::new());
        }
        let profiles = self.profiles(&device, gpu)?;
        let mut out = Vec::with_capacity(raw.len());
        for m in raw {
            let gi = nvml_raw::gpu_instance_by_id(&self.nvml, &device, m.gpu_instance_id).map_err(
                |e| {
                    raw_error(
                        e,
                        format!(
                            "gpu {gpu}, MIG device {}, GPU instance {}",
                            m.index, m.gpu_instance_id
                        ),
                    )
                },
            )?;
            let profile = profiles
                .iter()
                .find(|p| p.id == gi.profile_id)
                .map(|p| p.name.clone())
                .unwrap_or_default();
            out.push(MigDevice {
                parent_index: gpu,
                mig_index: m.index,
                gpu_instance_id: m.gpu_instance_id,
                compute_instance_id: m.compute_instance_id,
                profile,
                placement: Placement {
                    start: gi.start,
                    size: gi.size,
                },
                uuid: m.uuid,
                memory_mib: m.memory_bytes / MIB,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvml_names_lose_their_mig_prefix() {
        assert_eq!(
            normalize_profile_name("MIG 1g.10gb").as_deref(),
            Some("1g.10gb")
        );
        assert_eq!(
            normalize_profile_name("MIG 1g.5gb+me").as_deref(),
            Some("1g.5gb+me")
        );
        assert_eq!(
            normalize_profile_name("3g.40gb").as_deref(),
            Some("3g.40gb")
        );
        assert_eq!(normalize_profile_name(""), None);
        assert_eq!(normalize_profile_name("MIG "), None);
    }

    #[test]
    fn derived_names_match_nvidia_smi_on_a100_40gb() {
        let gpu = 40960;
        assert_eq!(derive_profile_name(0, 1, 4864, gpu), "1g.5gb");
        assert_eq!(derive_profile_name(7, 1, 4864, gpu), "1g.5gb+me");
        assert_eq!(derive_profile_name(9, 1, 9856, gpu), "1g.10gb");
        assert_eq!(derive_profile_name(1, 2, 9856, gpu), "2g.10gb");
        assert_eq!(derive_profile_name(2, 3, 20096, gpu), "3g.20gb");
        assert_eq!(derive_profile_name(3, 4, 20096, gpu), "4g.20gb");
        assert_eq!(derive_profile_name(4, 7, 40192, gpu), "7g.40gb");
    }

    #[test]
    fn derived_names_match_nvidia_smi_on_other_gpus() {
        // H200 141GB.
        let h200 = 143_771;
        assert_eq!(derive_profile_name(0, 1, 16 * 1024, h200), "1g.18gb");
        assert_eq!(derive_profile_name(1, 2, 33_280, h200), "2g.35gb");
        assert_eq!(derive_profile_name(4, 7, 140 * 1024, h200), "7g.141gb");
        // A30 24GB.
        assert_eq!(derive_profile_name(0, 1, 5952, 24_576), "1g.6gb");
        assert_eq!(derive_profile_name(1, 2, 11_968, 24_576), "2g.12gb");
        // RTX PRO 6000 Blackwell: axis of 12, suffixes.
        let rtx = 97_887;
        assert_eq!(derive_profile_name(0, 1, 24_000, rtx), "1g.24gb");
        assert_eq!(derive_profile_name(0xA, 1, 24_000, rtx), "1g.24gb+gfx");
        assert_eq!(derive_profile_name(0xD, 1, 24_000, rtx), "1g.24gb-me");
        assert_eq!(derive_profile_name(0xF, 1, 24_000, rtx), "1g.24gb+me.all");
        // Unknown GPU memory: round the profile's own GiB.
        assert_eq!(derive_profile_name(0, 1, 9984, 0), "1g.10gb");
    }

    #[test]
    fn nvml_codes_map_to_driver_errors() {
        let e = |code| RawError {
            call: "nvmlDeviceCreateGpuInstanceWithPlacement",
            code: Some(code),
            reason: "x".into(),
        };
        assert!(matches!(
            raw_error(e(nvml_raw::ERROR_INSUFFICIENT_RESOURCES), "gpu 0"),
            DriverError::InsufficientResources(_)
        ));
        assert!(matches!(
            raw_error(e(nvml_raw::ERROR_INVALID_ARGUMENT), "gpu 0"),
            DriverError::InvalidArgument(_)
        ));
        assert!(matches!(
            raw_error(e(nvml_raw::ERROR_NOT_FOUND), "gpu 0"),
            DriverError::NotFound(_)
        ));
        assert!(matches!(
            raw_error(e(nvml_raw::ERROR_IN_USE), "gpu 0"),
            DriverError::InUse(_)
        ));
        assert!(matches!(
            raw_error(e(nvml_raw::ERROR_GPU_IS_LOST), "gpu 0"),
            DriverError::GpuLost(_)
        ));
        assert!(matches!(
            safe_error("nvmlDeviceGetUUID", NvmlError::GpuLost, "gpu 0"),
            DriverError::GpuLost(_)
        ));
        assert!(matches!(
            optional_error(
                "nvmlDeviceGetProcessUtilization",
                NvmlError::NotSupported,
                "gpu 0"
            ),
            DriverError::NotSupported(_)
        ));
        let other = raw_error(e(999), "gpu 0");
        assert_eq!(
            other.to_string(),
            "nvmlDeviceCreateGpuInstanceWithPlacement failed: gpu 0: x"
        );
    }

    #[test]
    fn loading_a_missing_library_names_the_path() {
        let err = NvmlDriver::load(Path::new("/nonexistent/libnvidia-ml.so.1")).unwrap_err();
        assert!(matches!(err, DriverError::Load { .. }), "{err:?}");
        assert!(
            err.to_string().contains("/nonexistent/libnvidia-ml.so.1"),
            "{err}"
        );
    }
}
