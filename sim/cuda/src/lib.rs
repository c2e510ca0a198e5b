//! A stand-in for NVIDIA's `libcuda.so.1`, the CUDA driver API, for a
//! simulated node.
//!
//! Built as a cdylib (`libtessera_sim_cuda.so`, with the SONAME
//! `libcuda.so.1`), which the node builder installs as
//! `<root>/usr/lib/x86_64-linux-gnu/libcuda.so.1`. Programs reach it as they
//! reach the real driver: linked with `-lcuda`, or the way the CUDA runtime
//! does, `dlopen("libcuda.so.1")` then every entry point through
//! `cuGetProcAddress`. It simulates what a GPU-sharing layer (Tessera's
//! vGPU library) needs to see: device memory with a capacity, and device
//! time that kernel launches use up. Nothing runs and no device memory
//! exists: device pointers are unique, aligned addresses nothing backs.
//!
//! - Devices ([`config`]): the node's GPUs (`TESSERA_SIM_ROOT`, or the root
//!   the library is installed under), else one 80 GiB `NVIDIA H100 80GB
//!   HBM3`; `CUDA_VISIBLE_DEVICES` honoured as the real driver does;
//!   `TESSERA_SIM_CUDA_DEVICE_MEMORY_MIB` overrides every capacity.
//! - Memory (`registry`): per device and per process, charged by every
//!   device allocation API; past the capacity `CUDA_ERROR_OUT_OF_MEMORY`.
//!   Managed and host memory are real host memory and not charged. Lifetimes
//!   as the real driver keeps them: VMM memory while a handle reference or a
//!   mapping remains; pools keep freed memory down to their release
//!   threshold until a synchronisation or trim; a context's memory goes with
//!   it; each context costs `TESSERA_SIM_CUDA_CONTEXT_MIB` (default 0) of its
//!   own. `TESSERA_SIM_CUDA_PUBLISH_ON_MEMORY=1` publishes every change of a
//!   process's memory before the call returns.
//! - Launches ([`timeline`]): a kernel of G blocks costs G ×
//!   `TESSERA_SIM_CUDA_NS_PER_BLOCK` (default 1000) of device time, plus
//!   an optional fixed cost per launch, whole waves of blocks and seeded
//!   noise ([`timeline::CostModel`]), queued asynchronously on one clock
//!   per device that every process on the node shares
//!   (`<root>/run/tessera-sim/timeline/`), which also records each
//!   process's device time for readers outside; synchronising waits for
//!   the process's own work.
//! - Utilization (`publish`, [`utilfile`]): with a node, each process
//!   publishes its per-GPU busy time and memory under
//!   `<root>/run/tessera-sim/util/`, which the NVML stand-in turns into
//!   `nvmlDeviceGetProcessUtilization` and friends.
//!
//! Every call before a successful `cuInit` returns
//! `CUDA_ERROR_NOT_INITIALIZED`, except `cuDriverGetVersion`,
//! `cuGetErrorString`, `cuGetErrorName` and `cuGetProcAddress[_v2]`. A panic
//! inside any call returns `CUDA_ERROR_UNKNOWN`. `TESSERA_SIM_DEBUG=1`
//! prints the node served at `cuInit`.
//!
//! # Exported functions
//!
//! Init and lookup: `cuInit`, `cuDriverGetVersion`, `cuGetErrorString`,
//! `cuGetErrorName`, `cuGetProcAddress`, `cuGetProcAddress_v2`.
//!
//! Devices: `cuDeviceGetCount`, `cuDeviceGet`, `cuDeviceGetName`,
//! `cuDeviceGetUuid`, `cuDeviceGetUuid_v2`, `cuDeviceTotalMem`,
//! `cuDeviceTotalMem_v2`, `cuDeviceGetAttribute`, `cuDeviceGetPCIBusId`,
//! `cuDeviceGetDefaultMemPool`.
//!
//! Contexts, streams, modules: `cuDevicePrimaryCtxRetain`,
//! `cuDevicePrimaryCtxRelease`, `cuDevicePrimaryCtxRelease_v2`,
//! `cuDevicePrimaryCtxReset`, `cuDevicePrimaryCtxReset_v2`,
//! `cuDevicePrimaryCtxGetState`,
//! `cuCtxCreate_v2`, `cuCtxCreate_v3`, `cuCtxCreate_v4`, `cuCtxDestroy_v2`,
//! `cuCtxSetCurrent`, `cuCtxGetCurrent`, `cuCtxGetDevice`,
//! `cuCtxPushCurrent_v2`, `cuCtxPopCurrent_v2`, `cuCtxSynchronize`,
//! `cuCtxSetLimit`, `cuCtxGetLimit`,
//! `cuStreamCreate`, `cuStreamDestroy_v2`, `cuStreamSynchronize`,
//! `cuStreamGetCtx`, `cuStreamGetDevice`,
//! `cuModuleLoadData`, `cuModuleUnload`, `cuModuleGetFunction`.
//!
//! Memory: `cuMemGetInfo`, `cuMemGetInfo_v2`, `cuMemAlloc_v2`,
//! `cuMemFree_v2`, `cuMemAllocPitch_v2`, `cuMemAllocManaged`,
//! `cuMemAllocHost_v2`, `cuMemFreeHost`, `cuMemCreate`, `cuMemRelease`,
//! `cuMemAddressReserve`, `cuMemAddressFree`, `cuMemMap`, `cuMemUnmap`,
//! `cuMemSetAccess`, `cuMemGetAllocationGranularity`,
//! `cuMemRetainAllocationHandle`, `cuMemExportToShareableHandle`,
//! `cuMemImportFromShareableHandle`, `cuMemAllocAsync`,
//! `cuMemFreeAsync`, `cuMemPoolCreate`, `cuMemPoolDestroy`,
//! `cuMemPoolSetAttribute`, `cuMemPoolGetAttribute`, `cuMemPoolTrimTo`,
//! `cuDeviceGetMemPool`, `cuDeviceSetMemPool`, `cuMemAllocFromPoolAsync`,
//! `cuArrayCreate_v2`, `cuArrayDestroy`,
//! `cuArray3DCreate_v2`, `cuMipmappedArrayCreate`, `cuMipmappedArrayDestroy`.
//!
//! Execution: `cuLaunchKernel`, `cuLaunchKernelEx`,
//! `cuLaunchCooperativeKernel`, `cuGraphCreate`, `cuGraphAddKernelNode`,
//! `cuGraphAddKernelNode_v2`, `cuGraphInstantiateWithFlags`,
//! `cuGraphInstantiate_v2`, `cuGraphLaunch`, `cuGraphExecDestroy`,
//! `cuGraphDestroy`.
//!
//! The simulator's own: `tesseraSimCudaGetBusyNs`.
//!
//! The `cuGetProcAddress` mapping is in [`exports::procaddr::TABLE`].

pub mod config;
pub mod ffi;
pub mod handle;
pub mod root;
pub mod timeline;
pub mod utilfile;
pub mod va;

mod clock;
mod driver;
mod exports;
mod fasthash;
mod out;
mod publish;
mod registry;

pub use exports::procaddr::{Lookup, TABLE as PROC_ADDRESS_TABLE, lookup as lookup_proc_address};
