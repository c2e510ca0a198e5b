//! GPU processes as NVML reports them, from utilization files written here
//! in the layout the CUDA stand-in documents (`tessera_sim_cuda::utilfile`),
//! so every number is exact. The same queries against a running CUDA
//! stand-in are tested in `sim/cuda/tests/nvml_util.rs`.

mod common;

use std::path::Path;
use std::ptr;

use nvml_wrapper_sys::bindings::*;

use common::{MIB, SimNode, gpu};

const SUCCESS: nvmlReturn_t = nvmlReturn_enum_NVML_SUCCESS;
const NOT_FOUND: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
const INSUFFICIENT_SIZE: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
const NOT_SUPPORTED: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
const INVALID_ARGUMENT: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;

/// One sample: (monotonic ns, wall µs, cumulative busy ns, bytes held).
type Sample = (u64, u64, u64, u64);

fn check_word(seq: u64, s: Sample) -> u64 {
    seq ^ s.0.rotate_left(13)
        ^ s.1.rotate_left(29)
        ^ s.2.rotate_left(41)
        ^ s.3.rotate_left(53)
        ^ 0x9E37_79B9_7F4A_7C15
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec to a local.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn own_start_time() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("own stat");
    let rest = &stat[stat.rfind(')').expect("comm") + 1..];
    rest.split_whitespace()
        .nth(19)
        .and_then(|t| t.parse().ok())
        .expect("starttime")
}

/// Writes `gpu<gpu>-<pid>` under the node's util dir.
fn publish(root: &Path, gpu: u32, pid: u32, instance: Option<(u32, u32)>, samples: &[Sample]) {
    let start_time = if pid == std::process::id() {
        own_start_time()
    } else {
        0
    };
    let mut b = vec![0u8; 64 + 128 * 48];
    let (gi, ci) = instance.unwrap_or((u32::MAX, u32::MAX));
    b[..8].copy_from_slice(b"TCUTIL01");
    for (at, v) in [
        (8, 1u32),
        (12, gpu),
        (16, pid),
        (20, gi),
        (24, ci),
        (28, 128),
    ] {
        b[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }
    b[32..40].copy_from_slice(&start_time.to_le_bytes());
    b[40..48].copy_from_slice(&10_000_000u64.to_le_bytes());
    for (i, &s) in samples.iter().enumerate() {
        let seq = i as u64 + 1;
        let at = 64 + (i % 128) * 48;
        for (j, v) in [seq, s.0, s.1, s.2, s.3, check_word(seq, s)]
            .into_iter()
            .enumerate()
        {
            b[at + j * 8..at + j * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
    }
    let dir = root.join("run/tessera-sim/util");
    std::fs::create_dir_all(&dir).expect("util dir");
    std::fs::write(dir.join(format!("gpu{gpu}-{pid}")), b).expect("util file");
}

struct Api(NvmlLib);

impl Api {
    fn open(node: &SimNode) -> Api {
        let api = Api(node.load());
        // SAFETY: no arguments.
        assert_eq!(unsafe { api.0.nvmlInit_v2() }, SUCCESS);
        api
    }

    fn device(&self, index: u32) -> nvmlDevice_t {
        let mut d = ptr::null_mut();
        // SAFETY: out-pointer to a local.
        let rc = unsafe { self.0.nvmlDeviceGetHandleByIndex_v2(index, &mut d) };
        assert_eq!(rc, SUCCESS);
        d
    }

    fn samples(
        &self,
        d: nvmlDevice_t,
        room: u32,
        last_seen: u64,
    ) -> (nvmlReturn_t, u32, Vec<nvmlProcessUtilizationSample_t>) {
        let empty = nvmlProcessUtilizationSample_t {
            pid: 0,
            timeStamp: 0,
            smUtil: 0,
            memUtil: 0,
            encUtil: 0,
            decUtil: 0,
        };
        let mut buf = vec![empty; room as usize];
        let mut n = room;
        // SAFETY: the buffer holds `room` samples.
        let rc = unsafe {
            self.0
                .nvmlDeviceGetProcessUtilization(d, buf.as_mut_ptr(), &mut n, last_seen)
        };
        buf.truncate(if rc == SUCCESS { n as usize } else { 0 });
        (rc, n, buf)
    }

    fn processes(&self, d: nvmlDevice_t, room: u32) -> (nvmlReturn_t, u32, Vec<nvmlProcessInfo_t>) {
        let empty = nvmlProcessInfo_t {
            pid: 0,
            usedGpuMemory: 0,
            gpuInstanceId: 0,
            computeInstanceId: 0,
        };
        let mut buf = vec![empty; room as usize];
        let mut n = room;
        let out = if room == 0 {
            ptr::null_mut()
        } else {
            buf.as_mut_ptr()
        };
        // SAFETY: `out` is NULL or holds `room` entries.
        let rc = unsafe {
            self.0
                .nvmlDeviceGetComputeRunningProcesses_v3(d, &mut n, out)
        };
        buf.truncate(if rc == SUCCESS { n as usize } else { 0 });
        (rc, n, buf)
    }

    fn memory(&self, d: nvmlDevice_t) -> nvmlMemory_t {
        let mut m = nvmlMemory_t {
            total: 0,
            free: 0,
            used: 0,
        };
        // SAFETY: out-pointer to a local.
        let rc = unsafe { self.0.nvmlDeviceGetMemoryInfo(d, &mut m) };
        assert_eq!(rc, SUCCESS);
        m
    }

    fn rates(&self, d: nvmlDevice_t) -> (nvmlReturn_t, nvmlUtilization_t) {
        let mut u = nvmlUtilization_t { gpu: 0, memory: 0 };
        // SAFETY: out-pointer to a local.
        let rc = unsafe { self.0.nvmlDeviceGetUtilizationRates(d, &mut u) };
        (rc, u)
    }
}

/// A process that ran and was reaped: its pid names nobody now.
fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true")
        .spawn()
        .expect("spawn true");
    let pid = child.id();
    child.wait().expect("reap");
    pid
}

#[test]
fn process_utilization_is_busy_time_since_the_last_seen_sample() {
    let node = SimNode::new(vec![gpu(0, 0, "H100-80GB", false)]);
    let me = std::process::id();
    // Four samples 10 ms apart; busy 0, 5, 15, 25 ms: 50 %, then 100 %, 100 %.
    let ms = 1_000_000;
    let t0 = monotonic_ns();
    publish(
        node.root(),
        0,
        me,
        None,
        &[
            (t0, 1_000, 0, MIB),
            (t0 + 10 * ms, 2_000, 5 * ms, MIB),
            (t0 + 20 * ms, 3_000, 15 * ms, MIB),
            (t0 + 30 * ms, 4_000, 25 * ms, MIB),
        ],
    );
    publish(node.root(), 0, dead_pid(), None, &[(t0, 1_000, 0, 0)]);
    let api = Api::open(&node);
    let d = api.device(0);

    let (rc, n, got) = api.samples(d, 4, 0);
    assert_eq!(
        (rc, n),
        (SUCCESS, 1),
        "one sample for the live process only"
    );
    assert_eq!(got[0].pid, me);
    assert_eq!(got[0].timeStamp, 4_000, "stamped with the newest sample");
    assert_eq!(
        got[0].smUtil, 83,
        "25 ms busy of 30 ms since the oldest sample"
    );
    let (_, _, got) = api.samples(d, 4, 2_000);
    assert_eq!(got[0].smUtil, 100, "since the sample at 2000 µs");
    let (_, _, got) = api.samples(d, 4, 1_500);
    assert_eq!(
        got[0].smUtil, 83,
        "from the newest sample at or before 1500 µs"
    );
    assert_eq!(api.samples(d, 4, 4_000).0, NOT_FOUND, "nothing newer");

    // Counting: NULL buffer, too small a buffer, NULL count.
    let mut n = 0;
    // SAFETY: a NULL buffer asks for the count.
    let rc = unsafe {
        api.0
            .nvmlDeviceGetProcessUtilization(d, ptr::null_mut(), &mut n, 0)
    };
    assert_eq!((rc, n), (INSUFFICIENT_SIZE, 1));
    assert_eq!(api.samples(d, 0, 0).0, INSUFFICIENT_SIZE);
    // SAFETY: a NULL count is refused before anything is written.
    let rc = unsafe {
        api.0
            .nvmlDeviceGetProcessUtilization(d, ptr::null_mut(), ptr::null_mut(), 0)
    };
    assert_eq!(rc, INVALID_ARGUMENT);

    // Utilization rates: the last second of the newest samples.
    let (rc, rates) = api.rates(d);
    assert_eq!(rc, SUCCESS);
    assert_eq!((rates.gpu, rates.memory), (83, 0));
}

#[test]
fn running_processes_list_their_memory_and_mig_device() {
    let mut a100 = gpu(0, 0, "A100-40GB", true);
    a100.gpu_instances = vec![tessera_sim::state::SimGpuInstance {
        id: 1,
        profile_id: 9,
        start: 4,
        size: 4,
        compute_instances: vec![tessera_sim::state::SimComputeInstance {
            id: 0,
            profile_id: 2,
            uuid: "MIG-11111111-2222-3333-4444-555555555555".into(),
        }],
    }];
    let node = SimNode::new(vec![a100]);
    let me = std::process::id();
    let t0 = monotonic_ns();
    publish(node.root(), 0, me, Some((1, 0)), &[(t0, 1, 0, 300 * MIB)]);
    let api = Api::open(&node);
    let d = api.device(0);

    let (rc, n, _) = api.processes(d, 0);
    assert_eq!((rc, n), (INSUFFICIENT_SIZE, 1), "room 0 asks for the count");
    let (rc, n, list) = api.processes(d, 4);
    assert_eq!((rc, n), (SUCCESS, 1));
    assert_eq!(list[0].pid, me);
    assert_eq!(list[0].usedGpuMemory, 300 * MIB);
    assert_eq!((list[0].gpuInstanceId, list[0].computeInstanceId), (1, 0));
    let m = api.memory(d);
    assert_eq!(m.used, 300 * MIB);
    assert_eq!(m.free, m.total - 300 * MIB);

    // On the MIG device itself.
    let mut mig = ptr::null_mut();
    // SAFETY: out-pointer to a local.
    let rc = unsafe { api.0.nvmlDeviceGetMigDeviceHandleByIndex(d, 0, &mut mig) };
    assert_eq!(rc, SUCCESS);
    let (rc, _, list) = api.processes(mig, 4);
    assert_eq!((rc, list.len()), (SUCCESS, 1));
    assert_eq!(api.memory(mig).used, 300 * MIB);
    assert_eq!(api.samples(mig, 4, 0).0, NOT_SUPPORTED);
    assert_eq!(api.rates(mig).0, NOT_SUPPORTED);
}

#[test]
fn a_node_without_cuda_processes_is_idle() {
    let node = SimNode::new(vec![gpu(0, 0, "H100-80GB", false)]);
    let api = Api::open(&node);
    let d = api.device(0);
    assert_eq!(api.processes(d, 0).0, SUCCESS);
    assert_eq!(api.samples(d, 4, 0).0, NOT_FOUND);
    let (rc, rates) = api.rates(d);
    assert_eq!((rc, rates.gpu), (SUCCESS, 0));
    assert_eq!(api.memory(d).used, 0);
}
