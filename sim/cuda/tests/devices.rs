//! What the driver enumerates: the default GPU, a node's GPUs,
//! `CUDA_VISIBLE_DEVICES`, and the load-time-linked route.

mod common;

use common::{Fixture, MIB};

fn uuid_hex(uuid: &str) -> String {
    uuid.split_once('-')
        .map_or(uuid, |(_, rest)| rest)
        .to_ascii_lowercase()
}

#[test]
fn without_a_node_there_is_one_80_gib_h100() {
    let Some(fx) = Fixture::plain() else {
        return;
    };
    let run = fx.probe(&["info"], &[]).ok();
    assert_eq!(run.get("device_count"), "1");
    assert_eq!(run.get("driver_version"), "12080");
    assert_eq!(run.get("device.0.name"), "NVIDIA H100 80GB HBM3");
    assert_eq!(run.num("device.0.total_bytes") as u64, 80 << 30);
    assert_eq!(run.num("device.0.mem_free_bytes") as u64, 80 << 30);
    assert_eq!(run.get("device.0.compute_capability"), "9.0");
    assert_eq!(
        run.get("device.0.uuid"),
        uuid_hex(&tessera_sim_cuda::config::default_gpu_uuid())
    );
    assert!(
        run.get("library").starts_with(fx.lib_dir.to_str().unwrap()),
        "loaded {}",
        run.get("library")
    );
}

#[test]
fn a_node_presents_its_gpus_with_their_memory_and_sms() {
    let Some(fx) = Fixture::node("demo") else {
        return;
    };
    let state = fx.state.as_ref().unwrap();
    let run = fx.probe(&["info"], &[]).ok();
    assert_eq!(run.get("device_count"), "2");
    // The demo node: an H100 80GB SXM5 (132 SMs, mig.md) and an A100-SXM4-40GB
    // (108 SMs); memory as nvidia-smi shows the boards. Literals, not the
    // catalogue the stand-in serves: a change there must show here.
    let want = [
        ("H100-80GB", "NVIDIA H100 80GB HBM3", 81559, 132),
        ("A100-40GB", "NVIDIA A100-SXM4-40GB", 40960, 108),
    ];
    for (i, (gpu, (model, name, mib, sms))) in state.gpus.iter().zip(want).enumerate() {
        let key = |k: &str| format!("device.{i}.{k}");
        assert_eq!(gpu.model, model, "the demo node's GPU {i}");
        assert_eq!(run.get(&key("name")), name);
        assert_eq!(run.num(&key("total_bytes")) as u64, mib * MIB, "{name}");
        assert_eq!(run.num(&key("sm_count")) as u32, sms, "{name}");
        assert_eq!(run.get(&key("uuid")), uuid_hex(&gpu.uuid));
    }
    assert_eq!(run.get("device.1.compute_capability"), "8.0", "A100");
}

#[test]
fn visible_devices_reorder_select_and_stop_at_the_first_bad_entry() {
    let Some(fx) = Fixture::node("demo") else {
        return;
    };
    let state = fx.state.as_ref().unwrap();
    let names = |list: &str| {
        let run = fx.probe(&["info"], &[("CUDA_VISIBLE_DEVICES", list)]).ok();
        let n: usize = run.get("device_count").parse().unwrap();
        (0..n)
            .map(|i| run.get(&format!("device.{i}.name")).to_string())
            .collect::<Vec<_>>()
    };
    let (h100, a100) = ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB");
    assert_eq!(names("1,0"), [a100, h100]);
    assert_eq!(names("1"), [a100]);
    assert_eq!(names("0,7,1"), [h100], "enumeration stops at index 7");
    let a100_prefix = &state.gpus[1].uuid[..12];
    assert_eq!(names(&format!("{a100_prefix},0")), [a100, h100]);
    // A MIG device by UUID: its profile's name and memory.
    let gi = &state.gpus[1].gpu_instances[0];
    let mig_uuid = &gi.compute_instances[0].uuid;
    let run = fx
        .probe(&["info"], &[("CUDA_VISIBLE_DEVICES", mig_uuid)])
        .ok();
    // The demo node's first A100 instance is a 3g.20gb (profile 9): 20096 MiB
    // (mig.md: ≈ 19.62 GiB).
    assert_eq!(gi.profile_id, 9, "the demo node's first A100 instance");
    assert_eq!(run.get("device.0.name"), format!("{a100} MIG 3g.20gb"));
    assert_eq!(run.num("device.0.total_bytes") as u64, 20096 * MIB);
    assert_eq!(run.get("device.0.uuid"), uuid_hex(mig_uuid));
    // Nothing visible: cuInit fails as on a real host.
    for list in ["", "bogus", "5"] {
        fx.probe(&["info"], &[("CUDA_VISIBLE_DEVICES", list)])
            .failed()
            .naming(&["cuInit", "CUDA_ERROR_NO_DEVICE"]);
    }
}

#[test]
fn an_explicit_root_without_a_node_fails_init_and_says_why() {
    let Some(fx) = Fixture::plain() else {
        return;
    };
    let nowhere = fx.path().join("no-node");
    fx.probe(
        &["info"],
        &[("TESSERA_SIM_ROOT", nowhere.to_str().unwrap())],
    )
    .failed_with_two_lines()
    .naming(&[
        "tessera-sim-cuda: TESSERA_SIM_ROOT names",
        "CUDA_ERROR_NO_DEVICE",
    ]);
}

#[test]
fn memory_override_applies_to_every_device() {
    let Some(fx) = Fixture::node("demo") else {
        return;
    };
    let run = fx
        .probe(&["info"], &[("TESSERA_SIM_CUDA_DEVICE_MEMORY_MIB", "96")])
        .ok();
    assert_eq!(run.num("device.0.total_bytes") as u64, 96 * MIB);
    assert_eq!(run.num("device.1.mem_total_bytes") as u64, 96 * MIB);
}

#[test]
fn a_program_linked_against_libcuda_reaches_the_stand_in() {
    let Some(fx) = Fixture::node("demo") else {
        return;
    };
    let run = fx.linked_probe(&["info"], &[]).ok();
    assert_eq!(run.get("device_count"), "2");
    assert_eq!(run.get("device.1.name"), "NVIDIA A100-SXM4-40GB");
    let run = fx
        .linked_probe(
            &["alloc", "16", "5"],
            &[("TESSERA_SIM_CUDA_DEVICE_MEMORY_MIB", "64")],
        )
        .failed();
    assert_eq!(run.get("result"), "CUDA_ERROR_OUT_OF_MEMORY");
    assert_eq!(run.get("blocks"), "4");
    assert_eq!(run.get("mem_free_bytes"), "0");
}

#[test]
fn without_libcuda_on_the_path_the_probe_fails_in_one_line() {
    let Some(fx) = Fixture::plain() else {
        return;
    };
    let empty = fx.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let output = fx
        .command(&common::probe_exe(), &["info"], &[])
        .env("LD_LIBRARY_PATH", &empty)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    // A host with a real driver would find it; only check the failure shape here.
    let Ok(()) = common::require(&[common::Need::condition(
        !output.status.success(),
        "no libcuda.so.1 installed on this host",
        "run on a host without an NVIDIA driver",
    )]) else {
        return;
    };
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr.starts_with("tessera-cuda-probe: dlopen(\"libcuda.so.1\")"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

trait TwoLines {
    fn failed_with_two_lines(self) -> Self;
}

impl TwoLines for common::Run {
    /// Exit 1 with the library's line and the probe's line on stderr.
    fn failed_with_two_lines(self) -> Self {
        assert_eq!(self.code, Some(1), "{}\n{}", self.stdout, self.stderr);
        assert_eq!(self.stderr.lines().count(), 2, "{}", self.stderr);
        self
    }
}
