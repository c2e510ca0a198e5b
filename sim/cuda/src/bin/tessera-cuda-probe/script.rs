//! `script`: a sequence of driver calls, the way frameworks make them, each
//! step's result printed, none of them stopping the run. The tests of
//! `libtessera_vgpu.so` write the call sequences of PyTorch, NCCL, CuPy and
//! the CUDA samples as scripts; the same script runs against the simulator
//! and a real driver.
//!
//! Steps are arguments (one per argument, words separated by spaces); names
//! bind values for later steps. Sizes are MiB. Output: `step.<n>=<op> <RESULT>`
//! per step, plus `<name>.free=` / `<name>.total=` for `info`.
//!
//! ```text
//! retain DEV                primary context retained and made current
//! release DEV | reset DEV   cuDevicePrimaryCtxRelease_v2 / Reset_v2
//! ctx-create NAME DEV       cuCtxCreate_v2 (pushed)     ctx-destroy NAME
//! push NAME | pop           cuCtxPushCurrent_v2 / cuCtxPopCurrent_v2
//! alloc NAME MIB            cuMemAlloc_v2               free NAME
//! pitch NAME MIB            cuMemAllocPitch_v2 (1 MiB rows)
//! vmm NAME MIB DEV          cuMemCreate (device location)
//! reserve NAME MIB          cuMemAddressReserve         address-free NAME
//! map VA HANDLE             cuMemMap of the whole handle at VA's start (and access)
//! unmap VA                  cuMemUnmap of VA's reservation
//! release-handle NAME       cuMemRelease
//! retain-handle NAME VA     cuMemRetainAllocationHandle at VA
//! export FD HANDLE          cuMemExportToShareableHandle (POSIX fd)
//! import NAME FD            cuMemImportFromShareableHandle
//! stream NAME DEV           cuStreamCreate in DEV's primary context
//! async NAME MIB STREAM     cuMemAllocAsync (STREAM: a name or `null`)
//! free-async NAME STREAM    cuMemFreeAsync
//! pool-threshold DEV BYTES  cuMemPoolSetAttribute(RELEASE_THRESHOLD) on DEV's current pool (`max`: UINT64_MAX)
//! pool-trim DEV MIB         cuMemPoolTrimTo on DEV's current pool
//! pool-reserved NAME DEV    prints NAME=<RESERVED_MEM_CURRENT of DEV's current pool>
//! sync | sync-stream STREAM cuCtxSynchronize / cuStreamSynchronize
//! heap MIB                  cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE)
//! info NAME                 cuMemGetInfo_v2 → NAME.free, NAME.total
//! wait                      prints state=waiting, waits for a line on stdin
//! ```

use std::collections::HashMap;
use std::ffi::{c_int, c_ulonglong, c_void};
use std::io::{BufRead, Write};

use crate::cuda::*;

const MIB: usize = 1 << 20;
const PINNED: c_int = 1;
const LOCATION_DEVICE: c_int = 1;
const PROT_READWRITE: c_int = 3;
const HANDLE_TYPE_POSIX_FD: c_int = 1;
const ATTR_RELEASE_THRESHOLD: c_int = 4;
const ATTR_RESERVED_MEM_CURRENT: c_int = 5;
const LIMIT_MALLOC_HEAP_SIZE: c_int = 2;

/// Everything a script has named.
#[derive(Default)]
struct Names {
    contexts: HashMap<String, Handle>,
    pointers: HashMap<String, DevPtr>,
    handles: HashMap<String, c_ulonglong>,
    reservations: HashMap<String, (DevPtr, usize)>,
    streams: HashMap<String, Handle>,
    fds: HashMap<String, c_int>,
}

fn prop(device: c_int) -> MemAllocationProp {
    MemAllocationProp {
        kind: PINNED,
        requested_handle_types: HANDLE_TYPE_POSIX_FD,
        location: MemLocation {
            kind: LOCATION_DEVICE,
            id: device,
        },
        win32_handle_meta_data: std::ptr::null_mut(),
        alloc_flags: [0; 8],
    }
}

/// Runs `steps` against the driver reached by `route`.
pub fn run(route: Route, steps: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let api = load(route)?;
    // SAFETY: cuInit takes a flags word.
    api.check("cuInit", unsafe { (api.init)(0) })?;
    let mut names = Names::default();
    let out = std::io::stdout();
    for (n, step) in steps.iter().enumerate() {
        let words: Vec<&str> = step.split_whitespace().collect();
        let Some((&op, args)) = words.split_first() else {
            continue;
        };
        let rc =
            run_step(&api, &mut names, op, args).map_err(|e| format!("step {n} ({step}): {e}"))?;
        let mut out = out.lock();
        writeln!(out, "step.{n}={op} {}", api.error_name(rc))?;
        out.flush()?;
    }
    Ok(())
}

fn mib(arg: Option<&&str>) -> Result<usize, String> {
    arg.ok_or("missing size")?
        .parse::<usize>()
        .map(|m| m * MIB)
        .map_err(|e| format!("size: {e}"))
}

fn int(arg: Option<&&str>) -> Result<c_int, String> {
    arg.ok_or("missing number")?
        .parse()
        .map_err(|e| format!("number: {e}"))
}

fn name<'a>(arg: Option<&&'a str>) -> Result<&'a str, String> {
    arg.copied().ok_or_else(|| "missing name".to_string())
}

fn get<T: Copy>(map: &HashMap<String, T>, key: &str) -> Result<T, String> {
    map.get(key)
        .copied()
        .ok_or_else(|| format!("{key} is not defined"))
}

/// One step; its `CUresult` (the first failing call's, for steps of several).
fn run_step(api: &Api, n: &mut Names, op: &str, a: &[&str]) -> Result<CuResult, String> {
    let first = |codes: &[CuResult]| {
        codes
            .iter()
            .copied()
            .find(|&c| c != SUCCESS)
            .unwrap_or(SUCCESS)
    };
    // SAFETY: each call follows its cuda.h contract with live out-pointers;
    // handles come from earlier steps (a wrong script gets the driver's
    // error, as a wrong program would).
    let rc = unsafe {
        match op {
            "retain" => {
                let dev = int(a.first())?;
                let mut ctx = std::ptr::null_mut();
                let rc = (api.primary_ctx_retain)(&mut ctx, dev);
                if rc == SUCCESS {
                    (api.ctx_set_current)(ctx)
                } else {
                    rc
                }
            }
            "release" => (api.primary_ctx_release)(int(a.first())?),
            "reset" => (api.primary_ctx_reset)(int(a.first())?),
            "ctx-create" => {
                let mut ctx = std::ptr::null_mut();
                let rc = (api.ctx_create)(&mut ctx, 0, int(a.get(1))?);
                n.contexts.insert(name(a.first())?.into(), ctx);
                rc
            }
            "ctx-destroy" => (api.ctx_destroy)(get(&n.contexts, name(a.first())?)?),
            "push" => (api.ctx_push_current)(get(&n.contexts, name(a.first())?)?),
            "pop" => {
                let mut ctx = std::ptr::null_mut();
                (api.ctx_pop_current)(&mut ctx)
            }
            "alloc" => {
                let mut p = 0;
                let rc = (api.mem_alloc)(&mut p, mib(a.get(1))?);
                n.pointers.insert(name(a.first())?.into(), p);
                rc
            }
            "pitch" => {
                let (mut p, mut pitch) = (0, 0);
                let rows = mib(a.get(1))? / MIB;
                let rc = (api.mem_alloc_pitch)(&mut p, &mut pitch, MIB, rows, 4);
                n.pointers.insert(name(a.first())?.into(), p);
                rc
            }
            "free" => (api.mem_free)(get(&n.pointers, name(a.first())?)?),
            "vmm" => {
                let mut h = 0;
                let p = prop(int(a.get(2))?);
                let rc = (api.mem_create)(&mut h, mib(a.get(1))?, &p, 0);
                n.handles.insert(name(a.first())?.into(), h);
                rc
            }
            "reserve" => {
                let mut va = 0;
                let size = mib(a.get(1))?;
                let rc = (api.mem_address_reserve)(&mut va, size, 0, 0, 0);
                n.reservations.insert(name(a.first())?.into(), (va, size));
                rc
            }
            "address-free" => {
                let (va, size) = get(&n.reservations, name(a.first())?)?;
                (api.mem_address_free)(va, size)
            }
            "map" => {
                let (va, size) = get(&n.reservations, name(a.first())?)?;
                let h = get(&n.handles, name(a.get(1))?)?;
                let rc = (api.mem_map)(va, size, 0, h, 0);
                let desc = MemAccessDesc {
                    location: MemLocation {
                        kind: LOCATION_DEVICE,
                        id: 0,
                    },
                    flags: PROT_READWRITE,
                };
                if rc == SUCCESS {
                    (api.mem_set_access)(va, size, &desc, 1)
                } else {
                    rc
                }
            }
            "unmap" => {
                let (va, size) = get(&n.reservations, name(a.first())?)?;
                (api.mem_unmap)(va, size)
            }
            "release-handle" => (api.mem_release)(get(&n.handles, name(a.first())?)?),
            "retain-handle" => {
                let (va, _) = get(&n.reservations, name(a.get(1))?)?;
                let mut h = 0;
                let rc = (api.mem_retain_allocation_handle)(&mut h, va as *mut c_void);
                n.handles.insert(name(a.first())?.into(), h);
                rc
            }
            "export" => {
                let h = get(&n.handles, name(a.get(1))?)?;
                let mut fd: c_int = -1;
                let rc = (api.mem_export_to_shareable_handle)(
                    (&raw mut fd).cast(),
                    h,
                    HANDLE_TYPE_POSIX_FD,
                    0,
                );
                n.fds.insert(name(a.first())?.into(), fd);
                rc
            }
            "import" => {
                let fd = get(&n.fds, name(a.get(1))?)?;
                let mut h = 0;
                let rc = (api.mem_import_from_shareable_handle)(
                    &mut h,
                    fd as usize as *mut c_void,
                    HANDLE_TYPE_POSIX_FD,
                );
                n.handles.insert(name(a.first())?.into(), h);
                rc
            }
            "stream" => {
                let dev = int(a.get(1))?;
                let mut ctx = std::ptr::null_mut();
                let mut stream = std::ptr::null_mut();
                let mut popped = std::ptr::null_mut();
                let codes = [
                    (api.primary_ctx_retain)(&mut ctx, dev),
                    (api.ctx_push_current)(ctx),
                    (api.stream_create)(&mut stream, 0),
                    (api.ctx_pop_current)(&mut popped),
                ];
                n.streams.insert(name(a.first())?.into(), stream);
                first(&codes)
            }
            "async" | "free-async" | "sync-stream" => {
                let stream_arg = if op == "sync-stream" {
                    a.first()
                } else {
                    a.get(if op == "async" { 2 } else { 1 })
                };
                let stream = match name(stream_arg)? {
                    "null" => std::ptr::null_mut(),
                    s => get(&n.streams, s)?,
                };
                match op {
                    "async" => {
                        let mut p = 0;
                        let rc = (api.mem_alloc_async)(&mut p, mib(a.get(1))?, stream);
                        n.pointers.insert(name(a.first())?.into(), p);
                        rc
                    }
                    "free-async" => {
                        (api.mem_free_async)(get(&n.pointers, name(a.first())?)?, stream)
                    }
                    _ => (api.stream_synchronize)(stream),
                }
            }
            "pool-threshold" | "pool-trim" | "pool-reserved" => {
                let dev = int(a.get(if op == "pool-reserved" { 1 } else { 0 }))?;
                let mut pool = std::ptr::null_mut();
                let rc = (api.device_get_mem_pool)(&mut pool, dev);
                if rc != SUCCESS {
                    return Ok(rc);
                }
                match op {
                    "pool-threshold" => {
                        let mut bytes: u64 = match name(a.get(1))? {
                            "max" => u64::MAX,
                            b => b.parse().map_err(|e| format!("bytes: {e}"))?,
                        };
                        (api.mem_pool_set_attribute)(
                            pool,
                            ATTR_RELEASE_THRESHOLD,
                            (&raw mut bytes).cast(),
                        )
                    }
                    "pool-trim" => (api.mem_pool_trim_to)(pool, mib(a.get(1))?),
                    _ => {
                        let mut bytes: u64 = 0;
                        let rc = (api.mem_pool_get_attribute)(
                            pool,
                            ATTR_RESERVED_MEM_CURRENT,
                            (&raw mut bytes).cast(),
                        );
                        println!("{}={bytes}", name(a.first())?);
                        rc
                    }
                }
            }
            "sync" => (api.ctx_synchronize)(),
            "heap" => (api.ctx_set_limit)(LIMIT_MALLOC_HEAP_SIZE, mib(a.first())?),
            "info" => {
                let (mut free, mut total) = (0, 0);
                let rc = (api.mem_get_info)(&mut free, &mut total);
                let label = name(a.first())?;
                println!("{label}.free={free}");
                println!("{label}.total={total}");
                rc
            }
            "wait" => {
                println!("state=waiting");
                let _ = std::io::stdout().flush();
                let mut line = String::new();
                let _ = std::io::stdin().lock().read_line(&mut line);
                SUCCESS
            }
            other => return Err(format!("unknown step {other:?}")),
        }
    };
    Ok(rc)
}
