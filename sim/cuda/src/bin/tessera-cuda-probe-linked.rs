//! `tessera-cuda-probe-linked`: a program linked against `libcuda.so.1` at
//! load time, as one built with `nvcc`/`-lcuda` is. Its ELF `NEEDED` entry
//! is `libcuda.so.1` (the stand-in's SONAME), so the dynamic loader picks
//! whichever `libcuda.so.1` its search path (`LD_LIBRARY_PATH`, a node's
//! library directory) holds, and every call below is a direct call through
//! the PLT: the route an `LD_PRELOAD` interposer sees without `dlsym` or
//! `cuGetProcAddress`.
//!
//! Usage: `tessera-cuda-probe-linked info` or
//! `tessera-cuda-probe-linked alloc MIB [COUNT]`; `key=value` lines on
//! stdout, exit 1 with one line on stderr on failure.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong};
use std::process::ExitCode;

type CuResult = c_uint;
type Ctx = *mut std::ffi::c_void;

#[link(name = "tessera_sim_cuda", kind = "dylib")]
unsafe extern "C" {
    fn cuInit(flags: c_uint) -> CuResult;
    fn cuDeviceGetCount(count: *mut c_int) -> CuResult;
    fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: c_int) -> CuResult;
    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: c_int) -> CuResult;
    fn cuDevicePrimaryCtxRetain(ctx: *mut Ctx, dev: c_int) -> CuResult;
    fn cuCtxSetCurrent(ctx: Ctx) -> CuResult;
    fn cuMemAlloc_v2(dptr: *mut c_ulonglong, bytes: usize) -> CuResult;
    fn cuMemFree_v2(dptr: c_ulonglong) -> CuResult;
    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CuResult;
    fn cuGetErrorName(error: CuResult, name: *mut *const c_char) -> CuResult;
}

fn name_of(code: CuResult) -> String {
    let mut name: *const c_char = std::ptr::null();
    // SAFETY: cuGetErrorName writes a pointer to a static string.
    if unsafe { cuGetErrorName(code, &mut name) } != 0 || name.is_null() {
        return format!("CUresult {code}");
    }
    // SAFETY: a static NUL-terminated string of the driver's.
    unsafe { std::ffi::CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned()
}

fn check(call: &str, code: CuResult) -> Result<(), String> {
    if code == 0 {
        Ok(())
    } else {
        Err(format!("{call}: {}", name_of(code)))
    }
}

fn run(args: &[String]) -> Result<(), String> {
    // SAFETY: every call follows its cuda.h contract with live locals.
    unsafe {
        check("cuInit", cuInit(0))?;
        let mut count = 0;
        check("cuDeviceGetCount", cuDeviceGetCount(&mut count))?;
        println!("device_count={count}");
        let mut ctx = std::ptr::null_mut();
        check(
            "cuDevicePrimaryCtxRetain",
            cuDevicePrimaryCtxRetain(&mut ctx, 0),
        )?;
        check("cuCtxSetCurrent", cuCtxSetCurrent(ctx))?;
        match args.first().map(String::as_str) {
            Some("info") | None => {
                for dev in 0..count {
                    let mut name = [0 as c_char; 128];
                    check(
                        "cuDeviceGetName",
                        cuDeviceGetName(name.as_mut_ptr(), 128, dev),
                    )?;
                    let mut total = 0;
                    check("cuDeviceTotalMem_v2", cuDeviceTotalMem_v2(&mut total, dev))?;
                    let name = std::ffi::CStr::from_ptr(name.as_ptr()).to_string_lossy();
                    println!("device.{dev}.name={name}");
                    println!("device.{dev}.total_bytes={total}");
                }
                Ok(())
            }
            Some("alloc") => {
                let mib: usize = args
                    .get(1)
                    .and_then(|a| a.parse().ok())
                    .ok_or("alloc needs MIB")?;
                let count: usize = args
                    .get(2)
                    .map_or(Ok(1), |a| a.parse().map_err(|_| "bad COUNT"))?;
                let mut held = Vec::new();
                let mut result = 0;
                for _ in 0..count {
                    let mut p = 0;
                    result = cuMemAlloc_v2(&mut p, mib << 20);
                    if result != 0 {
                        break;
                    }
                    held.push(p);
                }
                let (mut free, mut total) = (0, 0);
                check("cuMemGetInfo_v2", cuMemGetInfo_v2(&mut free, &mut total))?;
                println!("result={}", name_of(result));
                println!("blocks={}", held.len());
                println!("allocated_mib={}", held.len() * mib);
                println!("mem_free_bytes={free}");
                println!("mem_total_bytes={total}");
                for p in held {
                    check("cuMemFree_v2", cuMemFree_v2(p))?;
                }
                check("cuMemAlloc_v2", result)
            }
            Some(other) => Err(format!(
                "unknown command {other:?} (info | alloc MIB [COUNT])"
            )),
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tessera-cuda-probe-linked: {e}");
            ExitCode::FAILURE
        }
    }
}
