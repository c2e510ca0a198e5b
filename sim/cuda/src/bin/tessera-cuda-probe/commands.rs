//! The probe's verbs.

use std::error::Error;
use std::ffi::{c_int, c_uint};
use std::hint::black_box;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};

use crate::cuda::*;

type Outcome = Result<(), Box<dyn Error>>;

const MIB: usize = 1 << 20;
/// `CU_MEM_ATTACH_GLOBAL`.
const ATTACH_GLOBAL: c_uint = 1;
/// `CU_MEM_ALLOCATION_TYPE_PINNED`, `CU_MEM_LOCATION_TYPE_DEVICE`.
const PINNED: c_int = 1;
const LOCATION_DEVICE: c_int = 1;
/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
const PROT_READWRITE: c_int = 3;

fn line(key: &str, value: impl std::fmt::Display) {
    println!("{key}={value}");
}

/// The driver with a primary context current on one device.
struct Session {
    api: Api,
    device: c_int,
    ctx: Handle,
}

impl Session {
    fn open(route: Route, device: c_int) -> Result<Session, Failure> {
        let api = load(route)?;
        // SAFETY: the entry points' cuda.h contracts; all pointers are live locals.
        unsafe {
            api.check("cuInit", (api.init)(0))?;
            let mut dev = 0;
            api.check("cuDeviceGet", (api.device_get)(&mut dev, device))?;
            let ctx = api.retain_primary_current(dev)?;
            Ok(Session {
                api,
                device: dev,
                ctx,
            })
        }
    }

    fn mem_info(&self) -> Result<(usize, usize), Failure> {
        let (mut free, mut total) = (0, 0);
        // SAFETY: cuMemGetInfo_v2 writes two size_t locals.
        let rc = unsafe { (self.api.mem_get_info)(&mut free, &mut total) };
        self.api.check("cuMemGetInfo_v2", rc)?;
        Ok((free, total))
    }

    fn stream(&self) -> Result<Handle, Failure> {
        let mut stream = std::ptr::null_mut();
        // SAFETY: writes one handle to a live local.
        let rc = unsafe { (self.api.stream_create)(&mut stream, 0) };
        self.api.check("cuStreamCreate", rc)?;
        Ok(stream)
    }

    fn function(&self) -> Result<Handle, Failure> {
        let image = b"tessera-cuda-probe kernel image\0";
        let mut module = std::ptr::null_mut();
        let mut function = std::ptr::null_mut();
        // SAFETY: the image and name are static; the out-pointers live locals.
        unsafe {
            self.api.check(
                "cuModuleLoadData",
                (self.api.module_load_data)(&mut module, image.as_ptr().cast()),
            )?;
            self.api.check(
                "cuModuleGetFunction",
                (self.api.module_get_function)(&mut function, module, c"probe_kernel".as_ptr()),
            )?;
        }
        Ok(function)
    }

    fn busy_ns(&self) -> Option<(u64, u64)> {
        let f = self.api.busy_ns?;
        let (mut busy, mut now) = (0, 0);
        // SAFETY: the simulator's query writes two u64 locals.
        let rc = unsafe { f(self.device, &mut busy, &mut now) };
        (rc == SUCCESS).then_some((busy, now))
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.ctx;
        // SAFETY: releases the reference the session retained.
        unsafe { (self.api.primary_ctx_release)(self.device) };
    }
}

fn uuid_text(bytes: &[u8; 16]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// `info`.
pub fn info(route: Route) -> Outcome {
    let api = load(route)?;
    line("library", &api.library);
    let mut version = 0;
    // SAFETY: every call below follows its cuda.h contract with live locals.
    unsafe {
        api.check("cuDriverGetVersion", (api.driver_get_version)(&mut version))?;
        line("driver_version", version);
        api.check("cuInit", (api.init)(0))?;
        let mut count = 0;
        api.check("cuDeviceGetCount", (api.device_get_count)(&mut count))?;
        line("device_count", count);
        for i in 0..count {
            let mut dev = 0;
            api.check("cuDeviceGet", (api.device_get)(&mut dev, i))?;
            let mut name = [0 as std::ffi::c_char; 256];
            api.check(
                "cuDeviceGetName",
                (api.device_get_name)(name.as_mut_ptr(), 256, dev),
            )?;
            let name = std::ffi::CStr::from_ptr(name.as_ptr()).to_string_lossy();
            let mut uuid = [0u8; 16];
            api.check("cuDeviceGetUuid_v2", (api.device_get_uuid)(&mut uuid, dev))?;
            let mut total = 0usize;
            api.check(
                "cuDeviceTotalMem_v2",
                (api.device_total_mem)(&mut total, dev),
            )?;
            let attribute = |attr: c_int| -> Result<c_int, Failure> {
                let mut v = 0;
                api.check(
                    "cuDeviceGetAttribute",
                    (api.device_get_attribute)(&mut v, attr, dev),
                )?;
                Ok(v)
            };
            let (sms, major, minor) = (attribute(16)?, attribute(75)?, attribute(76)?);
            let mut bus = [0 as std::ffi::c_char; 32];
            api.check(
                "cuDeviceGetPCIBusId",
                (api.device_get_pci_bus_id)(bus.as_mut_ptr(), 32, dev),
            )?;
            let bus = std::ffi::CStr::from_ptr(bus.as_ptr()).to_string_lossy();
            api.retain_primary_current(dev)?;
            let (mut free, mut mem_total) = (0, 0);
            api.check(
                "cuMemGetInfo_v2",
                (api.mem_get_info)(&mut free, &mut mem_total),
            )?;
            api.check(
                "cuCtxSetCurrent",
                (api.ctx_set_current)(std::ptr::null_mut()),
            )?;
            api.check(
                "cuDevicePrimaryCtxRelease_v2",
                (api.primary_ctx_release)(dev),
            )?;
            let key = |k: &str| format!("device.{i}.{k}");
            line(&key("name"), name);
            line(&key("uuid"), uuid_text(&uuid));
            line(&key("total_bytes"), total);
            line(&key("total_mib"), total / MIB);
            line(&key("sm_count"), sms);
            line(&key("compute_capability"), format!("{major}.{minor}"));
            line(&key("pci_bus_id"), bus);
            line(&key("mem_free_bytes"), free);
            line(&key("mem_total_bytes"), mem_total);
        }
    }
    Ok(())
}

/// An allocation API.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
#[value(rename_all = "snake_case")]
pub enum AllocApi {
    /// cuMemAlloc_v2.
    MemAlloc,
    /// cuMemAllocPitch_v2 (1 MiB rows).
    Pitch,
    /// cuMemAllocManaged.
    Managed,
    /// cuMemAllocHost_v2 (host memory).
    Host,
    /// cuMemCreate + cuMemAddressReserve + cuMemMap + cuMemSetAccess.
    Vmm,
    /// cuMemAllocAsync on a stream.
    Async,
    /// cuMemPoolCreate + cuMemAllocFromPoolAsync.
    PoolAsync,
    /// cuArrayCreate_v2 (FLOAT, 1024 wide).
    Array,
    /// cuArray3DCreate_v2 (FLOAT, 256×256×depth).
    Array3d,
    /// cuMipmappedArrayCreate (FLOAT, 1024 wide, 2 levels: 1.25 × MIB).
    Mipmap,
}

/// Arguments of `alloc`.
#[derive(Args)]
pub struct AllocArgs {
    /// The allocation API.
    #[arg(long, value_enum)]
    api: AllocApi,
    /// MiB per block.
    #[arg(long)]
    mib: usize,
    /// Device ordinal.
    #[arg(long, default_value_t = 0)]
    device: c_int,
    /// Blocks to allocate.
    #[arg(long, default_value_t = 1)]
    count: usize,
    /// Seconds to hold the blocks (after printing `state=holding`) before freeing.
    #[arg(long)]
    hold_secs: Option<f64>,
}

struct Allocator<'a> {
    s: &'a Session,
    api: AllocApi,
    stream: Handle,
    pool: Handle,
}

impl Allocator<'_> {
    fn prop(&self) -> MemAllocationProp {
        MemAllocationProp {
            kind: PINNED,
            requested_handle_types: 0,
            location: MemLocation {
                kind: LOCATION_DEVICE,
                id: self.s.device,
            },
            win32_handle_meta_data: std::ptr::null_mut(),
            alloc_flags: [0; 8],
        }
    }

    /// One block of `mib` MiB: the block and its bytes, or the failing call and code.
    fn one(&self, mib: usize) -> Result<(Block, usize), (&'static str, CuResult)> {
        let a = &self.s.api;
        let bytes = mib * MIB;
        let ok = |name, rc| {
            if rc == SUCCESS {
                Ok(())
            } else {
                Err((name, rc))
            }
        };
        // SAFETY: each call follows its cuda.h contract; descriptors and
        // out-pointers are live locals.
        unsafe {
            match self.api {
                AllocApi::MemAlloc => {
                    let mut p = 0;
                    ok("cuMemAlloc_v2", (a.mem_alloc)(&mut p, bytes))?;
                    Ok((Block::Linear(p), bytes))
                }
                AllocApi::Pitch => {
                    let (mut p, mut pitch) = (0, 0);
                    ok(
                        "cuMemAllocPitch_v2",
                        (a.mem_alloc_pitch)(&mut p, &mut pitch, MIB, mib, 4),
                    )?;
                    Ok((Block::Linear(p), pitch * mib))
                }
                AllocApi::Managed => {
                    let mut p = 0;
                    ok(
                        "cuMemAllocManaged",
                        (a.mem_alloc_managed)(&mut p, bytes, ATTACH_GLOBAL),
                    )?;
                    Ok((Block::Linear(p), bytes))
                }
                AllocApi::Host => {
                    let mut p = std::ptr::null_mut();
                    ok("cuMemAllocHost_v2", (a.mem_alloc_host)(&mut p, bytes))?;
                    Ok((Block::Host(p), bytes))
                }
                AllocApi::Vmm => {
                    let prop = self.prop();
                    let mut granularity = 0;
                    ok(
                        "cuMemGetAllocationGranularity",
                        (a.mem_get_allocation_granularity)(&mut granularity, &prop, 0),
                    )?;
                    let size = bytes.next_multiple_of(granularity.max(1));
                    let mut handle = 0;
                    ok("cuMemCreate", (a.mem_create)(&mut handle, size, &prop, 0))?;
                    let mut va = 0;
                    let rc = (a.mem_address_reserve)(&mut va, size, 0, 0, 0);
                    if rc != SUCCESS {
                        (a.mem_release)(handle);
                        return Err(("cuMemAddressReserve", rc));
                    }
                    let rc = (a.mem_map)(va, size, 0, handle, 0);
                    if rc != SUCCESS {
                        (a.mem_address_free)(va, size);
                        (a.mem_release)(handle);
                        return Err(("cuMemMap", rc));
                    }
                    let desc = MemAccessDesc {
                        location: prop.location,
                        flags: PROT_READWRITE,
                    };
                    let block = Block::Vmm { va, size, handle };
                    let rc = (a.mem_set_access)(va, size, &desc, 1);
                    if rc != SUCCESS {
                        self.free(block);
                        return Err(("cuMemSetAccess", rc));
                    }
                    Ok((block, size))
                }
                AllocApi::Async => {
                    let mut p = 0;
                    ok(
                        "cuMemAllocAsync",
                        (a.mem_alloc_async)(&mut p, bytes, self.stream),
                    )?;
                    Ok((Block::Async(p), bytes))
                }
                AllocApi::PoolAsync => {
                    let mut p = 0;
                    ok(
                        "cuMemAllocFromPoolAsync",
                        (a.mem_alloc_from_pool_async)(&mut p, bytes, self.pool, self.stream),
                    )?;
                    Ok((Block::Async(p), bytes))
                }
                AllocApi::Array => {
                    let d = ArrayDescriptor::floats(1024, mib * 256);
                    let mut h = std::ptr::null_mut();
                    ok("cuArrayCreate_v2", (a.array_create)(&mut h, &d))?;
                    Ok((Block::Array(h), bytes))
                }
                AllocApi::Array3d => {
                    let d = Array3dDescriptor::floats(256, 256, mib * 4);
                    let mut h = std::ptr::null_mut();
                    ok("cuArray3DCreate_v2", (a.array3d_create)(&mut h, &d))?;
                    Ok((Block::Array(h), bytes))
                }
                AllocApi::Mipmap => {
                    let d = Array3dDescriptor::floats(1024, mib * 256, 0);
                    let mut h = std::ptr::null_mut();
                    ok(
                        "cuMipmappedArrayCreate",
                        (a.mipmapped_array_create)(&mut h, &d, 2),
                    )?;
                    Ok((Block::Mipmap(h), bytes + bytes / 4))
                }
            }
        }
    }

    fn free(&self, block: Block) -> CuResult {
        let a = &self.s.api;
        // SAFETY: frees what `one` allocated, with the matching call.
        unsafe {
            match block {
                Block::Linear(p) => (a.mem_free)(p),
                Block::Host(p) => (a.mem_free_host)(p),
                Block::Vmm { va, size, handle } => {
                    let rc = (a.mem_unmap)(va, size);
                    let rc2 = (a.mem_address_free)(va, size);
                    let rc3 = (a.mem_release)(handle);
                    [rc, rc2, rc3]
                        .into_iter()
                        .find(|&r| r != SUCCESS)
                        .unwrap_or(SUCCESS)
                }
                Block::Async(p) => {
                    let rc = (a.mem_free_async)(p, self.stream);
                    let sync = (a.stream_synchronize)(self.stream);
                    if rc != SUCCESS { rc } else { sync }
                }
                Block::Array(h) => (a.array_destroy)(h),
                Block::Mipmap(h) => (a.mipmapped_array_destroy)(h),
            }
        }
    }
}

/// `alloc`.
pub fn alloc(route: Route, args: &AllocArgs) -> Outcome {
    let s = Session::open(route, args.device)?;
    let api_name = args
        .api
        .to_possible_value()
        .map(|v| v.get_name().to_string());
    line("library", &s.api.library);
    line("api", api_name.unwrap_or_default());
    line("device", args.device);
    let stream = if matches!(args.api, AllocApi::Async | AllocApi::PoolAsync) {
        s.stream()?
    } else {
        std::ptr::null_mut()
    };
    let mut pool = std::ptr::null_mut();
    if args.api == AllocApi::PoolAsync {
        let props = MemPoolProps {
            alloc_type: PINNED,
            handle_types: 0,
            location: MemLocation {
                kind: LOCATION_DEVICE,
                id: s.device,
            },
            win32_security_attributes: std::ptr::null_mut(),
            max_size: 0,
            usage: 0,
            reserved: [0; 54],
        };
        // SAFETY: cuMemPoolCreate reads the props and writes one handle.
        let rc = unsafe { (s.api.mem_pool_create)(&mut pool, &props) };
        s.api.check("cuMemPoolCreate", rc)?;
    }
    let allocator = Allocator {
        s: &s,
        api: args.api,
        stream,
        pool,
    };
    let mut blocks = Vec::with_capacity(args.count);
    let mut allocated = 0usize;
    let mut failure = None;
    for i in 0..args.count {
        match allocator.one(args.mib) {
            Ok((block, bytes)) => {
                blocks.push(block);
                allocated += bytes;
            }
            Err((call, code)) => {
                failure = Some(Failure {
                    call: format!(
                        "{call} (block {} of {}, {} MiB)",
                        i + 1,
                        args.count,
                        args.mib
                    ),
                    code: Some(code),
                    name: s.api.error_name(code),
                });
                break;
            }
        }
    }
    let result = failure
        .as_ref()
        .map_or(SUCCESS, |f| f.code.unwrap_or(SUCCESS));
    let (free, total) = s.mem_info()?;
    line("result", s.api.error_name(result));
    line("blocks", blocks.len());
    line("allocated_bytes", allocated);
    line("allocated_mib", allocated / MIB);
    line("mem_free_bytes", free);
    line("mem_total_bytes", total);
    if let Some(secs) = args.hold_secs {
        line("state", "holding");
        std::thread::sleep(Duration::from_secs_f64(secs.max(0.0)));
    }
    let count = blocks.len();
    for block in blocks {
        let rc = allocator.free(block);
        s.api.check("free", rc)?;
    }
    if !pool.is_null() {
        // SAFETY: destroys the pool made above, now empty.
        let rc = unsafe { (s.api.mem_pool_destroy)(pool) };
        s.api.check("cuMemPoolDestroy", rc)?;
    }
    if !stream.is_null() {
        // SAFETY: destroys the stream made above.
        let rc = unsafe { (s.api.stream_destroy)(stream) };
        s.api.check("cuStreamDestroy_v2", rc)?;
    }
    let (free_after, _) = s.mem_info()?;
    line("freed", count);
    line("mem_free_after_bytes", free_after);
    match failure {
        Some(f) => Err(f.into()),
        None => Ok(()),
    }
}

/// A launch API.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
#[value(rename_all = "snake_case")]
pub enum LaunchApi {
    /// cuLaunchKernel.
    Launch,
    /// cuLaunchKernelEx.
    LaunchEx,
    /// cuLaunchCooperativeKernel.
    Cooperative,
    /// A graph of KERNELS kernel nodes, one cuGraphLaunch per round.
    Graph,
}

/// Arguments of `launch`.
#[derive(Args)]
pub struct LaunchArgs {
    /// Kernels per round.
    #[arg(long)]
    kernels: u32,
    /// Thread blocks per kernel; a comma list gives the kernels of a round
    /// these sizes in turn (e.g. `100,300,1000`).
    #[arg(long, value_delimiter = ',', required = true)]
    blocks: Vec<u32>,
    /// Threads per block.
    #[arg(long, default_value_t = 128)]
    threads: u32,
    /// Repeat rounds for this long (default: one round).
    #[arg(long)]
    seconds: Option<f64>,
    /// Sleep this long after each round.
    #[arg(long, default_value_t = 0)]
    sleep_us: u64,
    /// The launch API.
    #[arg(long, value_enum, default_value_t = LaunchApi::Launch)]
    api: LaunchApi,
    /// Device ordinal.
    #[arg(long, default_value_t = 0)]
    device: c_int,
}

/// `launch`.
pub fn launch(route: Route, args: &LaunchArgs) -> Outcome {
    let s = Session::open(route, args.device)?;
    let a = &s.api;
    let stream = s.stream()?;
    let f = s.function()?;
    let block = [args.threads, 1, 1];
    let grids: Vec<[u32; 3]> = args.blocks.iter().map(|&b| [b, 1, 1]).collect();
    let grid_of = |kernel: u32| grids[kernel as usize % grids.len()];
    let mut exec = std::ptr::null_mut();
    let mut graph = std::ptr::null_mut();
    if args.api == LaunchApi::Graph {
        // SAFETY: graph calls with live out-pointers and a valid node struct.
        unsafe {
            a.check("cuGraphCreate", (a.graph_create)(&mut graph, 0))?;
            for k in 0..args.kernels {
                let params = KernelNodeParams {
                    func: f,
                    grid: grid_of(k),
                    block,
                    shared_mem_bytes: 0,
                    kernel_params: std::ptr::null_mut(),
                    extra: std::ptr::null_mut(),
                    kern: std::ptr::null_mut(),
                    ctx: std::ptr::null_mut(),
                };
                let mut node = std::ptr::null_mut();
                a.check(
                    "cuGraphAddKernelNode_v2",
                    (a.graph_add_kernel_node)(&mut node, graph, std::ptr::null(), 0, &params),
                )?;
            }
            a.check(
                "cuGraphInstantiateWithFlags",
                (a.graph_instantiate)(&mut exec, graph, 0),
            )?;
        }
    }
    let round = || -> Result<(), Failure> {
        // SAFETY: launches with handles made above; no kernel parameters.
        unsafe {
            match args.api {
                LaunchApi::Launch | LaunchApi::Cooperative => {
                    let cooperative = args.api == LaunchApi::Cooperative;
                    let call = if cooperative {
                        "cuLaunchCooperativeKernel"
                    } else {
                        "cuLaunchKernel"
                    };
                    for k in 0..args.kernels {
                        a.check(call, a.launch(cooperative, f, grid_of(k), block, stream))?;
                    }
                }
                LaunchApi::LaunchEx => {
                    for k in 0..args.kernels {
                        let config = LaunchConfig {
                            grid: grid_of(k),
                            block,
                            shared_mem_bytes: 0,
                            stream,
                            attrs: std::ptr::null_mut(),
                            num_attrs: 0,
                        };
                        a.check(
                            "cuLaunchKernelEx",
                            (a.launch_kernel_ex)(
                                &config,
                                f,
                                std::ptr::null_mut(),
                                std::ptr::null_mut(),
                            ),
                        )?;
                    }
                }
                LaunchApi::Graph => a.check("cuGraphLaunch", (a.graph_launch)(exec, stream))?,
            }
        }
        Ok(())
    };
    let busy_before = s.busy_ns();
    let start = Instant::now();
    let deadline = args
        .seconds
        .map(|secs| start + Duration::from_secs_f64(secs.max(0.0)));
    let mut rounds = 0u64;
    loop {
        round()?;
        rounds += 1;
        if args.sleep_us > 0 {
            std::thread::sleep(Duration::from_micros(args.sleep_us));
        }
        if deadline.is_none_or(|d| Instant::now() >= d) {
            break;
        }
    }
    let launch_elapsed = start.elapsed();
    // SAFETY: waits on the stream made above.
    a.check("cuStreamSynchronize", unsafe {
        (a.stream_synchronize)(stream)
    })?;
    let elapsed = start.elapsed();
    let busy_after = s.busy_ns();
    let kernels = rounds * u64::from(args.kernels);
    line("library", &a.library);
    line(
        "api",
        args.api
            .to_possible_value()
            .map(|v| v.get_name().to_string())
            .unwrap_or_default(),
    );
    line("rounds", rounds);
    line("kernels_launched", kernels);
    line(
        "blocks_per_kernel",
        args.blocks
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(","),
    );
    line("seconds", format!("{:.6}", elapsed.as_secs_f64()));
    line(
        "launches_per_sec",
        format!(
            "{:.1}",
            kernels as f64 / launch_elapsed.as_secs_f64().max(1e-9)
        ),
    );
    if let (Some((b0, _)), Some((b1, _))) = (busy_before, busy_after) {
        let busy = b1.saturating_sub(b0);
        line("busy_ns", busy);
        line(
            "busy_fraction",
            format!("{:.4}", busy as f64 / elapsed.as_nanos().max(1) as f64),
        );
    }
    // SAFETY: tears down what was made above.
    unsafe {
        if !exec.is_null() {
            a.check("cuGraphExecDestroy", (a.graph_exec_destroy)(exec))?;
            a.check("cuGraphDestroy", (a.graph_destroy)(graph))?;
        }
        a.check("cuStreamDestroy_v2", (a.stream_destroy)(stream))?;
    }
    line("result", a.error_name(SUCCESS));
    Ok(())
}

/// Arguments of `bench`.
#[derive(Args)]
pub struct BenchArgs {
    /// Calls per round.
    #[arg(long, default_value_t = 200_000)]
    iterations: u32,
    /// Rounds; the fastest is reported.
    #[arg(long, default_value_t = 5)]
    rounds: u32,
}

/// Min over `rounds` of the ns per iteration of `f` run `iterations` times.
fn measure(rounds: u32, iterations: u32, mut f: impl FnMut() -> bool) -> Result<f64, String> {
    let mut best = f64::INFINITY;
    for _ in 0..rounds.max(1) {
        let mut ok = true;
        let start = Instant::now();
        for _ in 0..iterations {
            ok &= black_box(f());
        }
        let ns = start.elapsed().as_nanos() as f64 / f64::from(iterations.max(1));
        if !ok {
            return Err("a call failed during the measurement".into());
        }
        best = best.min(ns);
    }
    Ok(best)
}

/// `bench`. Launches are free (`TESSERA_SIM_CUDA_NS_PER_BLOCK=0`) unless the
/// environment says otherwise, so the number is the call's cost, not the
/// simulated kernel's.
pub fn bench(route: Route, args: &BenchArgs) -> Outcome {
    if std::env::var_os("TESSERA_SIM_CUDA_NS_PER_BLOCK").is_none() {
        // SAFETY: single-threaded at this point: nothing is loaded yet and
        // no thread has been started.
        unsafe { std::env::set_var("TESSERA_SIM_CUDA_NS_PER_BLOCK", "0") };
    }
    let s = Session::open(route, 0)?;
    let a = &s.api;
    let stream = s.stream()?;
    let f = s.function()?;
    let (rounds, n) = (args.rounds, args.iterations);
    line("library", &a.library);
    line("bench.iterations", n);
    line("bench.rounds", rounds);

    let launch = measure(rounds, n, || {
        // SAFETY: a 1-block launch of a loaded function on a live stream.
        let rc = unsafe { a.launch(false, f, [1; 3], [1; 3], stream) };
        rc == SUCCESS
    })?;
    // SAFETY: waits on the stream made above.
    a.check("cuStreamSynchronize", unsafe {
        (a.stream_synchronize)(stream)
    })?;
    line("bench.launch_kernel_ns", format!("{launch:.1}"));

    for live in [1usize, 1000] {
        let mut held = Vec::with_capacity(live);
        for _ in 0..live {
            let mut p = 0;
            // SAFETY: allocates into a live local.
            a.check("cuMemAlloc_v2", unsafe { (a.mem_alloc)(&mut p, MIB) })?;
            held.push(p);
        }
        let ns = measure(rounds, n, || {
            let mut p = 0;
            // SAFETY: allocates into a live local and frees what it got.
            unsafe { (a.mem_alloc)(&mut p, MIB) == SUCCESS && (a.mem_free)(p) == SUCCESS }
        })?;
        line(
            &format!("bench.mem_alloc_free_live{live}_ns"),
            format!("{ns:.1}"),
        );
        for p in held {
            // SAFETY: frees an allocation made above.
            a.check("cuMemFree_v2", unsafe { (a.mem_free)(p) })?;
        }
    }

    let info = measure(rounds, n, || {
        let (mut free, mut total) = (0, 0);
        // SAFETY: writes two size_t locals.
        unsafe { (a.mem_get_info)(&mut free, &mut total) == SUCCESS }
    })?;
    line("bench.mem_get_info_ns", format!("{info:.1}"));
    // SAFETY: destroys the stream made above.
    a.check("cuStreamDestroy_v2", unsafe { (a.stream_destroy)(stream) })?;
    Ok(())
}
