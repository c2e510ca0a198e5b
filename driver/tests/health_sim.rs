//! `NvmlDriver`'s health, process and whole-GPU usage methods against the
//! simulated node:
//! XIDs and lost GPUs injected from another process (the `tessera-sim`
//! binary), seen through the NVML stand-in's event sets and return codes;
//! processes and their utilization from the files the CUDA stand-in
//! publishes (written here in its documented layout, so every number is
//! exact).
//!
//! Needs root (the node's device nodes), the NVML stand-in and `tessera-sim`
//! (`cargo build --workspace`): the prerequisite rule skips (locally) or
//! fails (`CI`, `TESSERA_REQUIRE_ALL=1`) without them.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tessera_driver::{DriverError, GpuDriver, GpuProcess, HealthEvent};
use tessera_test_support::artefact;

#[macro_use]
mod common;
use common::load;

/// The demo node's plain GPU (an H100) and MIG GPU (an A100-40GB).
const PLAIN_GPU: u32 = 0;
const MIG_GPU: u32 = 1;

/// Runs `tessera-sim <args> --root <root>`, which must succeed.
fn sim(root: &Path, args: &[&str]) {
    let out = Command::new(artefact("tessera-sim"))
        .args(args)
        .arg("--root")
        .arg(root)
        .output()
        .expect("run tessera-sim");
    assert!(
        out.status.success(),
        "tessera-sim {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn an_xid_injected_by_another_process_arrives_within_a_second() {
    let node = demo_node_or_skip!();
    let driver = Arc::new(load(node.root()));
    let uuid = driver.gpus().unwrap()[PLAIN_GPU as usize].uuid.clone();
    // The first call registers; nothing happened yet.
    assert_eq!(
        driver.wait_health_event(Duration::from_millis(50)).unwrap(),
        None
    );

    let waiter = {
        let driver = driver.clone();
        std::thread::spawn(move || {
            let event = driver.wait_health_event(Duration::from_secs(10));
            (event, Instant::now())
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    sim(node.root(), &["inject-xid", "--gpu", "0", "--xid", "79"]);
    let injected = Instant::now();
    let (event, arrived) = waiter.join().unwrap();
    assert_eq!(
        event.unwrap(),
        Some(HealthEvent::Xid {
            uuid,
            xid: 79,
            instance: None
        })
    );
    let latency = arrived.saturating_duration_since(injected);
    assert!(latency < Duration::from_secs(1), "{latency:?}");
    // Delivered once.
    assert_eq!(
        driver
            .wait_health_event(Duration::from_millis(100))
            .unwrap(),
        None
    );
}

#[test]
fn an_xid_in_a_mig_instance_names_the_instance() {
    let node = demo_node_or_skip!();
    let driver = load(node.root());
    let uuid = driver.gpus().unwrap()[MIG_GPU as usize].uuid.clone();
    let mig = driver.mig_devices(MIG_GPU).unwrap();
    let (gi, ci) = (mig[0].gpu_instance_id, mig[0].compute_instance_id);
    assert_eq!(
        driver.wait_health_event(Duration::from_millis(20)).unwrap(),
        None
    );
    sim(
        node.root(),
        &[
            "inject-xid",
            "--gpu",
            &uuid,
            "--xid",
            "48",
            "--gi",
            &gi.to_string(),
            "--ci",
            &ci.to_string(),
        ],
    );
    sim(node.root(), &["inject-xid", "--gpu", "1", "--xid", "63"]);
    let event = driver.wait_health_event(Duration::from_secs(2)).unwrap();
    assert_eq!(
        event,
        Some(HealthEvent::Xid {
            uuid: uuid.clone(),
            xid: 48,
            instance: Some((gi, ci))
        })
    );
    let event = driver.wait_health_event(Duration::from_secs(2)).unwrap();
    assert_eq!(
        event,
        Some(HealthEvent::Xid {
            uuid,
            xid: 63,
            instance: None
        })
    );
}

#[test]
fn a_lost_gpu_is_reported_once_and_answers_again_when_restored() {
    let node = demo_node_or_skip!();
    let driver = load(node.root());
    let uuid = driver.gpus().unwrap()[PLAIN_GPU as usize].uuid.clone();
    driver.check_gpu(PLAIN_GPU).unwrap();
    assert_eq!(
        driver.wait_health_event(Duration::from_millis(20)).unwrap(),
        None
    );

    sim(node.root(), &["lose-gpu", "--gpu", "0"]);
    let started = Instant::now();
    assert_eq!(
        driver.wait_health_event(Duration::from_secs(5)).unwrap(),
        Some(HealthEvent::Lost { uuid: uuid.clone() })
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    let err = driver.check_gpu(PLAIN_GPU).unwrap_err();
    assert!(matches!(err, DriverError::GpuLost(_)), "{err:?}");
    assert!(matches!(
        driver.processes(PLAIN_GPU),
        Err(DriverError::GpuLost(_))
    ));
    assert!(matches!(driver.gpus(), Err(DriverError::GpuLost(_))));
    driver.check_gpu(MIG_GPU).unwrap();
    // Once per loss.
    assert_eq!(
        driver
            .wait_health_event(Duration::from_millis(200))
            .unwrap(),
        None
    );

    sim(node.root(), &["lose-gpu", "--gpu", "0", "--restore"]);
    driver.check_gpu(PLAIN_GPU).unwrap();
    assert_eq!(
        driver
            .wait_health_event(Duration::from_millis(100))
            .unwrap(),
        None
    );
    sim(node.root(), &["inject-xid", "--gpu", "0", "--xid", "31"]);
    assert_eq!(
        driver.wait_health_event(Duration::from_secs(2)).unwrap(),
        Some(HealthEvent::Xid {
            uuid,
            xid: 31,
            instance: None
        })
    );
}

#[test]
fn a_wait_without_events_times_out_with_none() {
    let node = demo_node_or_skip!();
    let driver = load(node.root());
    for wait in [Duration::ZERO, Duration::from_millis(300)] {
        let started = Instant::now();
        assert_eq!(driver.wait_health_event(wait).unwrap(), None);
        let took = started.elapsed();
        assert!(
            took >= wait && took < wait + Duration::from_secs(1),
            "{took:?}"
        );
    }
}

/// Writes the utilization file the CUDA stand-in keeps for process `pid`
/// on GPU `gpu` (layout: `tessera_sim_cuda::utilfile`): two samples 100 ms
/// apart, 50 ms of them busy, `bytes` held.
fn publish(root: &Path, gpu: u32, instance: Option<(u32, u32)>, bytes: u64) -> u64 {
    let pid = std::process::id();
    let stat = std::fs::read_to_string("/proc/self/stat").expect("read /proc/self/stat");
    let start_time: u64 = stat[stat.rfind(')').expect("stat has a comm") + 1..]
        .split_whitespace()
        .nth(19)
        .and_then(|t| t.parse().ok())
        .expect("stat has a start time");
    let now_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is past 1970")
        .as_micros() as u64;
    let mono = 1_000_000_000u64;
    let samples = [
        (mono, now_us - 100_000, 0u64, bytes),
        (mono + 100_000_000, now_us, 50_000_000, bytes),
    ];
    let (gi, ci) = instance.unwrap_or((u32::MAX, u32::MAX));
    let mut b = vec![0u8; 64 + 128 * 48];
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
    for (i, s) in samples.iter().enumerate() {
        let seq = i as u64 + 1;
        let check = seq
            ^ s.0.rotate_left(13)
            ^ s.1.rotate_left(29)
            ^ s.2.rotate_left(41)
            ^ s.3.rotate_left(53)
            ^ 0x9E37_79B9_7F4A_7C15;
        let at = 64 + i * 48;
        for (j, v) in [seq, s.0, s.1, s.2, s.3, check].into_iter().enumerate() {
            b[at + j * 8..at + j * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
    }
    let dir = root.join("run/tessera-sim/util");
    std::fs::create_dir_all(&dir).expect("make the utilization directory");
    std::fs::write(dir.join(format!("gpu{gpu}-{pid}")), b).expect("write the utilization file");
    now_us
}

#[test]
fn processes_and_their_utilization_come_from_the_cuda_stand_in_files() {
    let node = demo_node_or_skip!();
    let driver = load(node.root());
    let me = std::process::id();
    assert_eq!(driver.processes(PLAIN_GPU).unwrap(), []);
    assert_eq!(driver.process_utilization(PLAIN_GPU, 0).unwrap(), []);

    let mig = driver.mig_devices(MIG_GPU).unwrap();
    let instance = (mig[0].gpu_instance_id, mig[0].compute_instance_id);
    publish(node.root(), MIG_GPU, Some(instance), 64 << 20);
    let newest_us = publish(node.root(), PLAIN_GPU, None, 3 << 30);

    assert_eq!(
        driver.processes(MIG_GPU).unwrap(),
        [GpuProcess {
            pid: me,
            used_memory_bytes: 64 << 20,
            instance: Some(instance),
        }]
    );
    assert_eq!(
        driver.processes(PLAIN_GPU).unwrap(),
        [GpuProcess {
            pid: me,
            used_memory_bytes: 3 << 30,
            instance: None,
        }]
    );
    let samples = driver.process_utilization(PLAIN_GPU, 0).unwrap();
    assert_eq!(samples.len(), 1, "{samples:?}");
    assert_eq!(
        (
            samples[0].pid,
            samples[0].sm_percent,
            samples[0].timestamp_us
        ),
        (me, 50, newest_us)
    );
    assert_eq!(
        driver.process_utilization(PLAIN_GPU, newest_us).unwrap(),
        [],
        "nothing newer than the last sample seen"
    );
}

#[test]
fn whole_gpu_memory_and_utilization_come_through_the_stand_in() {
    let node = demo_node_or_skip!();
    let driver = load(node.root());
    let total = driver.gpus().unwrap()[PLAIN_GPU as usize].memory_mib << 20;
    assert_eq!(driver.memory_info(PLAIN_GPU).unwrap(), (0, total), "idle");
    assert_eq!(driver.utilization(PLAIN_GPU).unwrap(), 0, "idle");

    publish(node.root(), PLAIN_GPU, None, 3 << 30);
    assert_eq!(driver.memory_info(PLAIN_GPU).unwrap(), (3 << 30, total));
    // The samples written are not within NVML's last-second window on the
    // node's monotonic clock: busy-ness counts nothing, the call answers.
    assert!(driver.utilization(PLAIN_GPU).unwrap() <= 100);
    assert!(matches!(
        driver.memory_info(7),
        Err(DriverError::NotFound(_))
    ));
}
