//! The CUDA stand-in and the NVML stand-in together: a probe process's
//! launches and allocations show in the node's `libnvidia-ml.so.1`
//! (`nvmlDeviceGetProcessUtilization`, `…GetUtilizationRates`,
//! `…GetComputeRunningProcesses_v3`, `…GetMemoryInfo`), called through
//! `nvml-wrapper-sys`'s declarations of `nvml.h`.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nvml_wrapper_sys::bindings::*;

use common::{Fixture, MIB, args};

const SUCCESS: nvmlReturn_t = nvmlReturn_enum_NVML_SUCCESS;
const NOT_FOUND: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
const INSUFFICIENT_SIZE: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
const NOT_SUPPORTED: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;

/// The node's NVML, initialised. Handles are opaque integers to the library
/// under test, so passing any value is sound; out-pointers are live locals.
struct Nvml(NvmlLib);

impl Nvml {
    fn open(fx: &Fixture) -> Nvml {
        // SAFETY: loading runs only the Rust runtime's initialisers.
        let lib = unsafe { NvmlLib::new(fx.nvml_path()) }.expect("load the NVML stand-in");
        // SAFETY: no arguments.
        assert_eq!(unsafe { lib.nvmlInit_v2() }, SUCCESS);
        Nvml(lib)
    }

    fn device(&self, index: u32) -> nvmlDevice_t {
        let mut d = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        let rc = unsafe { self.0.nvmlDeviceGetHandleByIndex_v2(index, &mut d) };
        assert_eq!(rc, SUCCESS);
        d
    }

    fn samples(
        &self,
        d: nvmlDevice_t,
        last_seen_us: u64,
    ) -> (nvmlReturn_t, Vec<nvmlProcessUtilizationSample_t>) {
        let mut buf = vec![
            nvmlProcessUtilizationSample_t {
                pid: 0,
                timeStamp: 0,
                smUtil: 0,
                memUtil: 0,
                encUtil: 0,
                decUtil: 0,
            };
            16
        ];
        let mut n = 16;
        // SAFETY: the buffer holds n samples.
        let rc = unsafe {
            self.0
                .nvmlDeviceGetProcessUtilization(d, buf.as_mut_ptr(), &mut n, last_seen_us)
        };
        buf.truncate(if rc == SUCCESS { n as usize } else { 0 });
        (rc, buf)
    }

    fn rates(&self, d: nvmlDevice_t) -> (nvmlReturn_t, u32) {
        let mut u = nvmlUtilization_t { gpu: 0, memory: 0 };
        // SAFETY: out-pointer to a local.
        let rc = unsafe { self.0.nvmlDeviceGetUtilizationRates(d, &mut u) };
        (rc, u.gpu)
    }

    fn processes(&self, d: nvmlDevice_t) -> Vec<nvmlProcessInfo_t> {
        let mut n = 0;
        // SAFETY: a NULL buffer with room 0 asks for the count.
        let rc = unsafe {
            self.0
                .nvmlDeviceGetComputeRunningProcesses_v3(d, &mut n, std::ptr::null_mut())
        };
        if n == 0 {
            assert_eq!(rc, SUCCESS);
            return Vec::new();
        }
        assert_eq!(rc, INSUFFICIENT_SIZE);
        let mut buf = vec![
            nvmlProcessInfo_t {
                pid: 0,
                usedGpuMemory: 0,
                gpuInstanceId: 0,
                computeInstanceId: 0,
            };
            n as usize + 4
        ];
        let mut room = buf.len() as u32;
        // SAFETY: the buffer holds `room` entries.
        let rc = unsafe {
            self.0
                .nvmlDeviceGetComputeRunningProcesses_v3(d, &mut room, buf.as_mut_ptr())
        };
        assert_eq!(rc, SUCCESS);
        buf.truncate(room as usize);
        buf
    }

    fn used_memory(&self, d: nvmlDevice_t) -> u64 {
        let mut m = nvmlMemory_t {
            total: 0,
            free: 0,
            used: 0,
        };
        // SAFETY: out-pointer to a local.
        let rc = unsafe { self.0.nvmlDeviceGetMemoryInfo(d, &mut m) };
        assert_eq!(rc, SUCCESS);
        assert_eq!(m.free + m.used, m.total);
        m.used
    }
}

impl Drop for Nvml {
    fn drop(&mut self) {
        // SAFETY: no arguments.
        unsafe { self.0.nvmlShutdown() };
    }
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// A probe running in the background, killed (and reaped) when dropped.
struct Background(Child);

impl Background {
    fn start(fx: &Fixture, args: &[&str], envs: &[(&str, &str)]) -> Background {
        let child = fx
            .command(&common::probe_exe(), args, envs)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the probe");
        Background(child)
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Reads stdout until a line equal to `line`.
    fn wait_for(&mut self, line: &str) {
        let out = self.0.stdout.take().expect("stdout");
        let mut reader = BufReader::new(out);
        let mut text = String::new();
        while reader.read_line(&mut text).unwrap_or(0) > 0 {
            if text.lines().any(|l| l == line) {
                self.0.stdout = Some(reader.into_inner());
                return;
            }
        }
        panic!("the probe ended without printing {line}: {text}");
    }

    fn kill(mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn nvml_reports_a_busy_probe_and_a_probe_holding_memory() {
    let Some(fx) = Fixture::node("demo") else {
        return;
    };
    let busy = Background::start(
        &fx,
        &args("launch --kernels 2 --blocks 1000 --seconds 4"),
        &[],
    );
    let mut holder = Background::start(
        &fx,
        &args("alloc --api mem_alloc --mib 512 --device 0 --hold-secs 30"),
        &[("CUDA_VISIBLE_DEVICES", "1")],
    );
    holder.wait_for("state=holding");
    std::thread::sleep(Duration::from_millis(1200));

    let nvml = Nvml::open(&fx);
    let (gpu0, gpu1) = (nvml.device(0), nvml.device(1));

    let since = now_us() - 500_000;
    let (rc, samples) = nvml.samples(gpu0, since);
    assert_eq!(rc, SUCCESS);
    let sample = samples
        .iter()
        .find(|s| s.pid == busy.pid())
        .unwrap_or_else(|| panic!("no sample of pid {} in {samples:?}", busy.pid()));
    assert!(
        sample.smUtil >= 85,
        "smUtil {} of a saturating loop",
        sample.smUtil
    );
    assert!(sample.timeStamp > since && sample.timeStamp <= now_us());
    let (rc, rates) = nvml.rates(gpu0);
    assert_eq!(rc, SUCCESS);
    assert!(rates >= 85, "gpu utilization {rates}");

    // The holder used GPU 1 (as its CUDA device 0): listed there with its memory.
    let procs = nvml.processes(gpu1);
    let info = procs
        .iter()
        .find(|p| p.pid == holder.pid())
        .unwrap_or_else(|| panic!("pid {} not in {procs:?}", holder.pid()));
    assert_eq!(info.usedGpuMemory, 512 * MIB);
    assert_eq!(info.gpuInstanceId, u32::MAX, "not on a MIG device");
    assert_eq!(nvml.used_memory(gpu1), 512 * MIB);
    assert!(nvml.processes(gpu0).iter().all(|p| p.pid != holder.pid()));
    let (_, idle) = nvml.samples(gpu1, since);
    assert!(idle.iter().all(|s| s.smUtil == 0), "{idle:?}");

    // MIG device handles are refused by the utilization queries.
    let mut mig = std::ptr::null_mut();
    // SAFETY: out-pointer to a local.
    let rc = unsafe {
        nvml.0
            .nvmlDeviceGetMigDeviceHandleByIndex(gpu1, 0, &mut mig)
    };
    assert_eq!(rc, SUCCESS);
    assert_eq!(nvml.samples(mig, 0).0, NOT_SUPPORTED);

    // Killed: gone from the list, its memory no longer used.
    let pid = holder.pid();
    holder.kill();
    assert!(nvml.processes(gpu1).iter().all(|p| p.pid != pid));
    assert_eq!(nvml.used_memory(gpu1), 0);
    drop(busy);
}

#[test]
fn process_utilization_follows_the_duty_cycle() {
    let Some(fx) = Fixture::node("demo") else {
        return;
    };
    // 1 ms of work every ~3.1 ms.
    let probe = Background::start(
        &fx,
        &args("launch --kernels 1 --blocks 1000 --seconds 4 --sleep-us 3000"),
        &[],
    );
    std::thread::sleep(Duration::from_millis(1300));
    let nvml = Nvml::open(&fx);
    let gpu0 = nvml.device(0);
    let start = Instant::now();
    let since = now_us() - 1_000_000;
    let (rc, samples) = nvml.samples(gpu0, since);
    assert_eq!(rc, SUCCESS);
    let s = samples
        .iter()
        .find(|s| s.pid == probe.pid())
        .unwrap_or_else(|| panic!("no sample of pid {} in {samples:?}", probe.pid()));
    assert!((15..=45).contains(&s.smUtil), "smUtil {}", s.smUtil);
    // Asking again from the returned timestamp covers only what is new.
    std::thread::sleep(Duration::from_millis(300).saturating_sub(start.elapsed()));
    let (rc, again) = nvml.samples(gpu0, s.timeStamp);
    assert_eq!(rc, SUCCESS);
    let s2 = again
        .iter()
        .find(|x| x.pid == probe.pid())
        .expect("a newer sample");
    assert!(s2.timeStamp > s.timeStamp);
    assert!((10..=50).contains(&s2.smUtil), "smUtil {}", s2.smUtil);
    drop(probe);
}

#[test]
fn an_idle_node_has_no_processes_and_no_samples() {
    let Some(fx) = Fixture::node("demo") else {
        return;
    };
    // A process that released its contexts (and ended) leaves no file behind.
    fx.probe(&["info"], &[]).ok();
    let util = fx.root.as_ref().unwrap().join("run/tessera-sim/util");
    let left: Vec<_> = std::fs::read_dir(&util)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        left.is_empty(),
        "files left in {}: {left:?}",
        util.display()
    );
    let nvml = Nvml::open(&fx);
    let gpu0 = nvml.device(0);
    assert_eq!(nvml.samples(gpu0, 0).0, NOT_FOUND);
    let mut n = 0;
    // SAFETY: NULL buffer: asks for the count.
    let rc = unsafe {
        nvml.0
            .nvmlDeviceGetProcessUtilization(gpu0, std::ptr::null_mut(), &mut n, 0)
    };
    assert_eq!((rc, n), (INSUFFICIENT_SIZE, 0));
    assert!(nvml.processes(gpu0).is_empty());
    assert_eq!(nvml.rates(gpu0), (SUCCESS, 0));
    assert_eq!(nvml.used_memory(gpu0), 0);
}
