//! GPU access for Tessera.
//!
//! [`GpuDriver`] is the narrow trait the rest of Tessera uses to talk to the GPU
//! driver; [`nvml::NvmlDriver`] implements it over NVML (the real library on a
//! GPU node, the `sim/` stand-in on a simulated one) and [`fake::FakeDriver`] in
//! memory for unit tests. The readers in [`procfs`] and [`devices`] find host facts
//! under a configurable root, and [`discover`] puts it all together.
#![deny(missing_docs)]

pub mod devices;
pub mod discover;
pub mod fake;
pub mod nvml;
mod nvml_raw;
pub mod procfs;
pub mod soname;

use tessera_model::gpu::{
    ComputeInstance, GpuInfo, GpuInstance, GpuInstanceProfileInfo, MigDevice,
};
use tessera_model::mig::Placement;

/// Errors from the GPU driver.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The NVML library could not be loaded or initialised.
    #[error("cannot load NVML from {path}: {reason}")]
    Load {
        /// Library path tried.
        path: String,
        /// Why it failed.
        reason: String,
    },
    /// An NVML call returned an error.
    #[error("{call} failed: {reason}")]
    Call {
        /// The NVML function.
        call: &'static str,
        /// NVML's error text.
        reason: String,
    },
    /// The request names something that does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The GPU cannot satisfy the request (placement taken, too many instances).
    #[error("{0}")]
    InsufficientResources(String),
    /// The request is not valid for this GPU (illegal placement, unknown profile).
    #[error("{0}")]
    InvalidArgument(String),
    /// The instance is still in use (a GI that still holds CIs).
    #[error("{0}")]
    InUse(String),
    /// The GPU fell off the bus or stopped answering (`NVML_ERROR_GPU_IS_LOST`).
    #[error("{0}")]
    GpuLost(String),
    /// The driver (or this implementation) cannot answer the call.
    #[error("{0}")]
    NotSupported(String),
}

/// A health event the driver reported for a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthEvent {
    /// An XID error (`nvmlEventTypeXidCriticalError`) on the GPU with `uuid`.
    Xid {
        /// The GPU's `GPU-…` uuid.
        uuid: String,
        /// The XID number (e.g. 48, 63, 79).
        xid: u64,
        /// For an XID inside a MIG instance: its GPU- and compute-instance ids.
        instance: Option<(u32, u32)>,
    },
    /// The GPU stopped answering (fell off the bus, `GPU_IS_LOST`).
    Lost {
        /// The GPU's `GPU-…` uuid.
        uuid: String,
    },
}

/// A process holding a context on a GPU, as NVML reports it (host pids).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuProcess {
    /// Pid in the host's pid namespace.
    pub pid: u32,
    /// GPU memory the process holds, bytes (0 when NVML cannot tell).
    pub used_memory_bytes: u64,
    /// On a MIG GPU: the GPU- and compute-instance ids the process runs in.
    pub instance: Option<(u32, u32)>,
}

/// One process's SM utilization sample (`nvmlDeviceGetProcessUtilization`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessUtilization {
    /// Pid in the host's pid namespace.
    pub pid: u32,
    /// SM utilization, percent of the whole GPU.
    pub sm_percent: u32,
    /// When the sample was taken, microseconds (NVML's clock).
    pub timestamp_us: u64,
}

/// The GPU operations Tessera needs, nothing more.
pub trait GpuDriver {
    /// Driver version string.
    fn driver_version(&self) -> Result<String, DriverError>;
    /// Every GPU, in index order, with its MIG mode.
    fn gpus(&self) -> Result<Vec<GpuInfo>, DriverError>;
    /// GPU-instance profiles the GPU supports (enumerated by NVML enum index).
    fn gpu_instance_profiles(&self, gpu: u32) -> Result<Vec<GpuInstanceProfileInfo>, DriverError>;
    /// Legal placements of a profile (by device profile id) on the GPU.
    fn possible_placements(&self, gpu: u32, profile_id: u32)
    -> Result<Vec<Placement>, DriverError>;
    /// GPU instances that exist on the GPU.
    fn gpu_instances(&self, gpu: u32) -> Result<Vec<GpuInstance>, DriverError>;
    /// Creates a GPU instance of a profile at an explicit placement.
    fn create_gpu_instance(
        &self,
        gpu: u32,
        profile_id: u32,
        placement: Placement,
    ) -> Result<GpuInstance, DriverError>;
    /// Destroys a GPU instance; fails with [`DriverError::InUse`] while it holds compute instances.
    fn destroy_gpu_instance(&self, gpu: u32, gpu_instance_id: u32) -> Result<(), DriverError>;
    /// Compute instances inside a GPU instance.
    fn compute_instances(
        &self,
        gpu: u32,
        gpu_instance_id: u32,
    ) -> Result<Vec<ComputeInstance>, DriverError>;
    /// Creates the compute instance that spans the whole GPU instance.
    fn create_compute_instance(
        &self,
        gpu: u32,
        gpu_instance_id: u32,
    ) -> Result<ComputeInstance, DriverError>;
    /// Destroys a compute instance.
    fn destroy_compute_instance(
        &self,
        gpu: u32,
        gpu_instance_id: u32,
        compute_instance_id: u32,
    ) -> Result<(), DriverError>;
    /// MIG devices under a GPU, in MIG-index order (empty when MIG is off).
    fn mig_devices(&self, gpu: u32) -> Result<Vec<MigDevice>, DriverError>;

    /// Waits up to `timeout` for the next health event on any GPU (XID
    /// critical errors, a GPU lost). The first call registers for the events;
    /// `Ok(None)` when none came in time.
    fn wait_health_event(
        &self,
        timeout: std::time::Duration,
    ) -> Result<Option<HealthEvent>, DriverError> {
        std::thread::sleep(timeout);
        Ok(None)
    }

    /// Whether the GPU still answers: `Err(DriverError::GpuLost)` when it fell
    /// off the bus.
    fn check_gpu(&self, gpu: u32) -> Result<(), DriverError> {
        self.gpus()?
            .iter()
            .any(|g| g.index == gpu)
            .then_some(())
            .ok_or_else(|| DriverError::NotFound(format!("no GPU with index {gpu}")))
    }

    /// Processes with a compute context on the GPU (host pids).
    fn processes(&self, gpu: u32) -> Result<Vec<GpuProcess>, DriverError> {
        Err(DriverError::NotSupported(format!(
            "process listing on GPU {gpu}"
        )))
    }

    /// Per-process SM utilization samples on the GPU newer than `since_us`.
    fn process_utilization(
        &self,
        gpu: u32,
        since_us: u64,
    ) -> Result<Vec<ProcessUtilization>, DriverError> {
        let _ = since_us;
        Err(DriverError::NotSupported(format!(
            "process utilization on GPU {gpu}"
        )))
    }

    /// The whole GPU's device memory `(used, total)`, bytes
    /// (`nvmlDeviceGetMemoryInfo`).
    fn memory_info(&self, gpu: u32) -> Result<(u64, u64), DriverError> {
        Err(DriverError::NotSupported(format!(
            "memory info of GPU {gpu}"
        )))
    }

    /// The whole GPU's utilization over the driver's last sample period,
    /// percent (`nvmlDeviceGetUtilizationRates`, its `gpu` figure).
    fn utilization(&self, gpu: u32) -> Result<u32, DriverError> {
        Err(DriverError::NotSupported(format!(
            "utilization of GPU {gpu}"
        )))
    }
}
