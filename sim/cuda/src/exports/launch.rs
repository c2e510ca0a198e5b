//! Kernel launches and graphs: each costs simulated time on the stream's
//! device's shared timeline, by the cost model of [`crate::timeline`]
//! (launch overhead, blocks in whole waves, optional noise).

use std::ffi::{c_uint, c_ulonglong, c_void};

use crate::driver::{self, Res};
use crate::ffi::*;
use crate::handle::{Handle, Kind};
use crate::out;

use super::{entry, with_handle};

/// Thread blocks of a launch geometry; `INVALID_VALUE` for an empty grid or
/// a block of no or more than 1024 threads.
#[inline]
fn blocks(grid: [c_uint; 3], block: [c_uint; 3]) -> Res<u64> {
    let threads = u64::from(block[0]) * u64::from(block[1]) * u64::from(block[2]);
    let blocks = u64::from(grid[0]) * u64::from(grid[1]) * u64::from(grid[2]);
    if blocks == 0 || threads == 0 || threads > 1024 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(blocks)
}

/// Enqueues a launch of `f` with `blocks` on `stream`'s device. A
/// cooperative launch must fit on the device at once (SMs × 32 blocks),
/// else `CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE`.
#[inline]
fn launch(f: CuFunction, blocks: u64, stream: CuStream, cooperative: bool) -> Res<()> {
    let driver = driver::get()?;
    if cooperative {
        let device = driver.device_at(driver::stream_device(stream)?)?;
        if blocks > u64::from(device.spec.sm_count) * 32 {
            return Err(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
        }
    }
    if Handle::of(f, Kind::Function).is_none() {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    let device = driver.device_at(driver::stream_device(stream)?)?;
    device.timeline.launch(blocks);
    Ok(())
}

/// An export with `cuLaunchKernel`'s parameters up to `kernelParams`, then
/// `$extra`: the geometry's blocks launched by [`launch`]. Kernel parameters
/// are not read.
macro_rules! grid_launch {
    ($(#[$doc:meta])* $name:ident($($extra:ident: $extra_ty:ty),*), cooperative: $cooperative:literal) => {
        $(#[$doc])*
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            f: CuFunction,
            grid_dim_x: c_uint,
            grid_dim_y: c_uint,
            grid_dim_z: c_uint,
            block_dim_x: c_uint,
            block_dim_y: c_uint,
            block_dim_z: c_uint,
            _shared_mem_bytes: c_uint,
            h_stream: CuStream,
            _kernel_params: *mut *mut c_void,
            $($extra: $extra_ty),*
        ) -> CuResult {
            entry(|| {
                let n = blocks(
                    [grid_dim_x, grid_dim_y, grid_dim_z],
                    [block_dim_x, block_dim_y, block_dim_z],
                )?;
                launch(f, n, h_stream, $cooperative)
            })
        }
    };
}

grid_launch! {
    /// `cuLaunchKernel`: asynchronous; blocks the caller only while more than
    /// 5 ms of work is queued.
    cuLaunchKernel(_extra: *mut *mut c_void), cooperative: false
}

grid_launch! {
    /// `cuLaunchCooperativeKernel`: as `cuLaunchKernel`, but the grid must fit
    /// on the device at once.
    cuLaunchCooperativeKernel(), cooperative: true
}

/// `cuLaunchKernelEx`: the geometry and stream from `CUlaunchConfig`
/// (attributes are not read).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const CuLaunchConfig,
    f: CuFunction,
    _kernel_params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> CuResult {
    entry(|| {
        // SAFETY: cuda.h contract: `config` is null or a valid CUlaunchConfig.
        let c = unsafe { out::read(config) }?;
        let n = blocks(
            [c.grid_dim_x, c.grid_dim_y, c.grid_dim_z],
            [c.block_dim_x, c.block_dim_y, c.block_dim_z],
        )?;
        launch(f, n, c.stream, false)
    })
}

/// `cuGraphCreate`: `flags` must be 0.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphCreate(ph_graph: *mut CuGraph, flags: c_uint) -> CuResult {
    entry(|| {
        if ph_graph.is_null() || flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let graph = driver::get()?.registry().create_graph();
        // SAFETY: cuda.h contract: `phGraph` is valid for one write (non-null).
        unsafe { out::write(ph_graph, graph.ptr()) }
    })
}

/// Adds a kernel node with the geometry both parameter structs start with.
fn add_kernel_node(
    ph_graph_node: *mut CuGraphNode,
    h_graph: CuGraph,
    dependencies: *const CuGraphNode,
    num_dependencies: usize,
    params: *const CuKernelNodeParamsV1,
) -> CuResult {
    entry(|| {
        let graph = Handle::of(h_graph, Kind::Graph).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if ph_graph_node.is_null() || (num_dependencies > 0 && dependencies.is_null()) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: cuda.h contract: `nodeParams` is null or a valid
        // CUDA_KERNEL_NODE_PARAMS(_v2), both of which begin with this struct.
        let p = unsafe { out::read(params) }?;
        if Handle::of(p.func, Kind::Function).is_none() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let n = blocks(
            [p.grid_dim_x, p.grid_dim_y, p.grid_dim_z],
            [p.block_dim_x, p.block_dim_y, p.block_dim_z],
        )?;
        let node = driver::get()?.registry().add_kernel_node(graph, n)?;
        // SAFETY: cuda.h contract: `phGraphNode` is valid for one write (non-null).
        unsafe { out::write(ph_graph_node, node.ptr()) }
    })
}

/// An export of `cuGraphAddKernelNode` for one version of its parameter
/// struct, through [`add_kernel_node`].
macro_rules! add_kernel_node_export {
    ($(#[$doc:meta])* $name:ident($params:ty)) => {
        $(#[$doc])*
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            ph_graph_node: *mut CuGraphNode,
            h_graph: CuGraph,
            dependencies: *const CuGraphNode,
            num_dependencies: usize,
            node_params: *const $params,
        ) -> CuResult {
            let params = node_params.cast();
            add_kernel_node(ph_graph_node, h_graph, dependencies, num_dependencies, params)
        }
    };
}

add_kernel_node_export! {
    /// `cuGraphAddKernelNode_v2` (CUDA 12.0). Dependencies are accepted and
    /// not modelled: a graph's kernels run back to back.
    cuGraphAddKernelNode_v2(CuKernelNodeParams)
}

add_kernel_node_export! {
    /// `cuGraphAddKernelNode` (CUDA 10.0, `CUDA_KERNEL_NODE_PARAMS` v1).
    cuGraphAddKernelNode(CuKernelNodeParamsV1)
}

fn instantiate(ph_graph_exec: *mut CuGraphExec, h_graph: CuGraph) -> Res<()> {
    let graph = Handle::of(h_graph, Kind::Graph).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if ph_graph_exec.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let exec = driver::get()?.registry().instantiate(graph)?;
    // SAFETY: cuda.h contract: `phGraphExec` is valid for one write (non-null).
    unsafe { out::write(ph_graph_exec, exec.ptr()) }
}

/// `cuGraphInstantiateWithFlags`: snapshots the graph's kernels.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    ph_graph_exec: *mut CuGraphExec,
    h_graph: CuGraph,
    _flags: c_ulonglong,
) -> CuResult {
    entry(|| instantiate(ph_graph_exec, h_graph))
}

/// `cuGraphInstantiate_v2` (CUDA 11.0 signature with error node and log).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiate_v2(
    ph_graph_exec: *mut CuGraphExec,
    h_graph: CuGraph,
    _ph_error_node: *mut CuGraphNode,
    _log_buffer: *mut std::ffi::c_char,
    _buffer_size: usize,
) -> CuResult {
    entry(|| instantiate(ph_graph_exec, h_graph))
}

/// `cuGraphLaunch`: the graph's kernels as one piece of work on the
/// stream's device (one launch of all their blocks: one overhead).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphLaunch(h_graph_exec: CuGraphExec, h_stream: CuStream) -> CuResult {
    with_handle(
        h_graph_exec,
        Kind::GraphExec,
        CUDA_ERROR_INVALID_VALUE,
        |driver, exec| {
            let blocks = driver.registry().exec_blocks(exec)?;
            let device = driver.device_at(driver::stream_device(h_stream)?)?;
            device.timeline.launch(blocks);
            Ok(())
        },
    )
}

/// `cuGraphExecDestroy`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecDestroy(h_graph_exec: CuGraphExec) -> CuResult {
    with_handle(
        h_graph_exec,
        Kind::GraphExec,
        CUDA_ERROR_INVALID_VALUE,
        |driver, exec| driver.registry().destroy_exec(exec),
    )
}

/// `cuGraphDestroy`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphDestroy(h_graph: CuGraph) -> CuResult {
    with_handle(
        h_graph,
        Kind::Graph,
        CUDA_ERROR_INVALID_VALUE,
        |driver, graph| driver.registry().destroy_graph(graph),
    )
}
