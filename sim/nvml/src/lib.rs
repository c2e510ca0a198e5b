//! A stand-in for NVIDIA's `libnvidia-ml.so.1`, backed by a simulated node.
//!
//! Built as a cdylib (`libtessera_sim_nvml.so`), which the node builder
//! installs as `<root>/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.<version>`
//! (with the link `libnvidia-ml.so.1`). Programs
//! load it exactly as they load the real library (Tessera's `driver` crate
//! through `nvml-wrapper`, with `Nvml::builder().lib_path(..)`), and get the
//! GPUs, MIG mode and MIG instances of the node whose state file lives under
//! that root (`tessera_sim::state`). GPU and compute instances are created
//! and destroyed through the simulated driver's rules (`tessera_sim::mig`)
//! and written back to the state file, so every process serving the same
//! node sees them.
//!
//! - [`ffi`]: the C ABI: return codes, constants and `#[repr(C)]` structs of
//!   `nvml.h`, written independently of any binding crate.
//! - `exports`: the exported functions, listed below.
//! - `root`: which node the library serves (`TESSERA_SIM_ROOT`, or where the
//!   library was loaded from).
//! - `node`: the init reference count and the cached, stamp-checked node state.
//! - `handle`, `lookup`: handles are tagged integers, checked on every call.
//! - `profiles`: what NVML reports about profiles, from the model catalogue.
//! - `events`: the event sets, delivering from the node's health log.
//! - `util`: GPU processes, their memory and utilization, from the files the
//!   CUDA stand-in publishes under the node root.
//!
//! A GPU marked lost (`tessera-sim lose-gpu`) answers every call that names
//! it, or a MIG instance on it, with `NVML_ERROR_GPU_IS_LOST`, getting its
//! handle by index or UUID included; `nvmlDeviceGetCount` still counts it.
//!
//! Every call before `nvmlInit*` (and after the matching `nvmlShutdown`)
//! returns `NVML_ERROR_UNINITIALIZED`, except `nvmlErrorString`. `nvmlInit*`
//! returns `NVML_ERROR_DRIVER_NOT_LOADED`, with one line on stderr naming
//! what it looked for, when no node can be found. A panic inside any call
//! returns `NVML_ERROR_UNKNOWN`. Set `TESSERA_SIM_DEBUG=1` for a line naming
//! the node served and the reason behind state-file errors.
//!
//! # Exported functions
//!
//! System: `nvmlInit`, `nvmlInit_v2`, `nvmlInitWithFlags`, `nvmlShutdown`,
//! `nvmlErrorString`, `nvmlSystemGetDriverVersion`,
//! `nvmlSystemGetNVMLVersion`, `nvmlSystemGetCudaDriverVersion`,
//! `nvmlSystemGetCudaDriverVersion_v2`.
//!
//! Devices: `nvmlDeviceGetCount`, `nvmlDeviceGetCount_v2`,
//! `nvmlDeviceGetHandleByIndex`, `nvmlDeviceGetHandleByIndex_v2`,
//! `nvmlDeviceGetHandleByUUID`, `nvmlDeviceGetIndex`, `nvmlDeviceGetUUID`,
//! `nvmlDeviceGetName`, `nvmlDeviceGetMinorNumber`, `nvmlDeviceGetMemoryInfo`,
//! `nvmlDeviceGetMemoryInfo_v2`, `nvmlDeviceGetMigMode`,
//! `nvmlDeviceSetMigMode`, `nvmlDeviceGetMaxMigDeviceCount`,
//! `nvmlDeviceGetMigDeviceHandleByIndex`,
//! `nvmlDeviceGetDeviceHandleFromMigDeviceHandle`,
//! `nvmlDeviceIsMigDeviceHandle`, `nvmlDeviceGetGpuInstanceId`,
//! `nvmlDeviceGetComputeInstanceId`.
//!
//! Processes (from the utilization files of the CUDA stand-in,
//! `tessera-sim-cuda`, see `util`): `nvmlDeviceGetProcessUtilization`,
//! `nvmlDeviceGetUtilizationRates`, `nvmlDeviceGetComputeRunningProcesses_v3`;
//! `nvmlDeviceGetMemoryInfo[_v2]` count their memory as used.
//!
//! Events (XIDs injected with `tessera-sim inject-xid`, see `events`):
//! `nvmlEventSetCreate`, `nvmlDeviceRegisterEvents`,
//! `nvmlDeviceGetSupportedEventTypes`, `nvmlEventSetWait_v2`,
//! `nvmlEventSetWait`, `nvmlEventSetFree`.
//!
//! MIG: `nvmlDeviceGetGpuInstanceProfileInfo`,
//! `nvmlDeviceGetGpuInstanceProfileInfoV`,
//! `nvmlDeviceGetGpuInstancePossiblePlacements_v2`,
//! `nvmlDeviceGetGpuInstanceRemainingCapacity`, `nvmlDeviceCreateGpuInstance`,
//! `nvmlDeviceCreateGpuInstanceWithPlacement`, `nvmlGpuInstanceDestroy`,
//! `nvmlDeviceGetGpuInstances`, `nvmlDeviceGetGpuInstanceById`,
//! `nvmlGpuInstanceGetInfo`, `nvmlGpuInstanceGetComputeInstanceProfileInfo`,
//! `nvmlGpuInstanceGetComputeInstanceProfileInfoV`,
//! `nvmlGpuInstanceGetComputeInstanceRemainingCapacity`,
//! `nvmlGpuInstanceGetComputeInstancePossiblePlacements`,
//! `nvmlGpuInstanceCreateComputeInstance`,
//! `nvmlGpuInstanceCreateComputeInstanceWithPlacement`,
//! `nvmlComputeInstanceDestroy`, `nvmlGpuInstanceGetComputeInstances`,
//! `nvmlGpuInstanceGetComputeInstanceById`, `nvmlComputeInstanceGetInfo`,
//! `nvmlComputeInstanceGetInfo_v2`.
//!
//! Board, PCI, topology and telemetry (`exports::info`, values from the
//! state's PCI bus and the board table in `hw`): `nvmlDeviceGetPciInfo`,
//! `_v2`, `_v3`, `nvmlDeviceGetPciInfoExt`, `nvmlDeviceGetHandleByPciBusId[_v2]`,
//! `nvmlDeviceGetHandleBySerial`, `nvmlDeviceGetAttributes[_v2]` (MIG
//! devices), `nvmlDeviceGetCudaComputeCapability`, `nvmlDeviceGetArchitecture`,
//! `nvmlDeviceGetBrand`, serial, part number, VBIOS and InfoROM versions,
//! topology common ancestor, P2P status, same-board, power (usage, energy,
//! limits), temperature and thresholds, clocks and event reasons, ECC mode
//! and counters, remapped rows, PCIe link and counters, persistence /
//! compute / display / performance modes, BAR1, CPU and memory affinity,
//! encoder/decoder utilization and sessions, graphics and MPS process lists
//! (empty), violation status, field values (each field `NOT_SUPPORTED`),
//! `nvmlSystemGetProcessName`, `nvmlUnitGetCount`.
//!
//! Everything else `nvml.h` declares (NVML 13, as go-nvml ships it, and the
//! `nvml-wrapper-sys` 0.10 bindings) is exported too and answers
//! `NVML_ERROR_NOT_SUPPORTED` (`exports::unsupported`): clients bind lazily
//! (go-nvml at first call, where a missing symbol is a crash), so no symbol
//! may be missing.
//!
//! The cdylib carries the SONAME `libnvidia-ml.so.1` (`build.rs`); the node
//! builder installs it as `libnvidia-ml.so.<driver version>` with the SONAME
//! link next to it, as a driver install does.

pub mod ffi;

mod events;
mod exports;
mod handle;
mod hw;
mod lookup;
mod node;
mod out;
mod profiles;
mod root;
mod util;

pub use node::DEBUG_ENV;
pub use root::ROOT_ENV;
