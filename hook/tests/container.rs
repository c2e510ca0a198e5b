//! The hook binary for a real container: runc runs a busybox bundle whose
//! config names an allocation; the hook (registered as prestart and as
//! createContainer, as a runtime without CDI would run it) creates the device
//! nodes in the container's /dev, grants them in the device cgroup, bind-mounts
//! the spec's files read-only, records the binding, and removes it at poststop.
//! Skipped, saying why, without root, runc or a static busybox.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Fixture, Need, alloc_spec, require};
use serde_json::{Value, json};
use tessera_test_support::rootfs::busybox;

/// Root (the hook's trust checks, mounts), runc and busybox for the rootfs.
fn runc_available() -> bool {
    require(&[Need::Root, Need::Program("runc"), Need::Program("busybox")]).is_ok()
}

/// A bundle whose process runs `script` with busybox sh, with the hook
/// registered as prestart, createContainer and poststop.
fn bundle(fx: &Fixture, annotations: Value, env: &[&str], script: &str) {
    bundle_with_hooks(
        fx,
        annotations,
        env,
        script,
        &["prestart", "createContainer"],
    );
}

/// Like [`bundle`], with the hook registered at `points` (and poststop).
fn bundle_with_hooks(
    fx: &Fixture,
    annotations: Value,
    env: &[&str],
    script: &str,
    points: &[&str],
) {
    let rootfs = fx.path("bundle/rootfs");
    fs::create_dir_all(rootfs.join("bin")).expect("bin");
    fs::copy(busybox().expect("busybox"), rootfs.join("bin/busybox")).expect("copy busybox");
    let hook = |verb: &str| {
        json!({"path": common::hook_binary(),
               "args": ["tessera-hook", "--config", fx.path("hook.toml"), verb],
               "env": ["PATH=/usr/bin:/bin"]})
    };
    let mut env: Vec<String> = env.iter().map(|s| (*s).to_owned()).collect();
    env.push("PATH=/bin".into());
    let mut hooks = json!({"poststop": [hook("poststop")]});
    for point in points {
        hooks[*point] = json!([hook("prestart")]);
    }
    let config = json!({
        "ociVersion": "1.0.2",
        "process": {"terminal": false, "user": {"uid": 1000, "gid": 1000},
                    "args": ["/bin/busybox", "sh", "-c", script], "env": env, "cwd": "/"},
        "root": {"path": "rootfs", "readonly": false},
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}
        ],
        "annotations": annotations,
        "hooks": hooks,
        "linux": {
            "resources": {"devices": [{"allow": false, "access": "rwm"}]},
            "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}]
        }
    });
    fx.write_config(&config);
}

struct Run {
    id: String,
    bundle: PathBuf,
    out: PathBuf,
}

impl Run {
    fn create(fx: &Fixture, tag: &str) -> (Run, std::process::ExitStatus, String) {
        let id = format!("tessera-hook-test-{tag}-{}", std::process::id());
        let out_path = fx.path("container.out");
        let err_path = fx.path("runc-create.err");
        let out_file = fs::File::create(&out_path).expect("out file");
        let err_file = fs::File::create(&err_path).expect("err file");
        // Files, not pipes: the container's init keeps its stdio open until it
        // exits, so a pipe would never reach end-of-file while it waits for start.
        let status = Command::new("runc")
            .args(["create", "--bundle"])
            .arg(fx.path("bundle"))
            .arg(&id)
            .stdin(Stdio::null())
            .stdout(out_file)
            .stderr(err_file)
            .status()
            .expect("runc create");
        let stderr = fs::read_to_string(&err_path).unwrap_or_default();
        (
            Run {
                id,
                bundle: fx.path("bundle"),
                out: out_path,
            },
            status,
            stderr,
        )
    }

    fn state(&self) -> Value {
        let out = Command::new("runc")
            .args(["state", &self.id])
            .output()
            .expect("runc state");
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }

    fn start_and_wait(&self) -> String {
        let ok = Command::new("runc")
            .args(["start", &self.id])
            .status()
            .expect("runc start");
        assert!(ok.success(), "runc start failed");
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.state()["status"] != "stopped" {
            assert!(Instant::now() < deadline, "container did not stop");
            std::thread::sleep(Duration::from_millis(50));
        }
        fs::read_to_string(&self.out).expect("container output")
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = Command::new("runc")
            .args(["delete", "--force", &self.id])
            .current_dir(&self.bundle)
            .output();
    }
}

fn binding(fx: &Fixture, id: &str) -> Option<Value> {
    let raw = fs::read(fx.path(&format!("state/alloc/{id}/binding.json"))).ok()?;
    serde_json::from_slice(&raw).ok()
}

const CHECK_SCRIPT: &str = "\
ls -ln /dev/nvidia0 /dev/nvidiactl /dev/nvidia-caps/nvidia-cap12 | busybox awk '{print $1, $3, $4, $5, $6, $NF}'; \
cat /usr/local/tessera/vgpu.json; \
echo x 2>/dev/null > /usr/local/tessera/vgpu.json || echo vgpu.json-read-only; \
cat /dev/nvidia0 2>&1 | busybox sed 's/.*: //'; \
test -w /var/run/tessera/vgpu.accounting && echo region-writable; \
touch /var/run/tessera/mine 2>/dev/null || echo accounting-dir-read-only; \
rm -f /var/run/tessera/vgpu.accounting 2>/dev/null || echo region-stays";

fn host_files(fx: &Fixture) -> PathBuf {
    let host = fx.path("host");
    fs::create_dir_all(&host).expect("host");
    fs::write(host.join("vgpu.json"), "{\"memoryLimitMiB\":8000}\n").expect("vgpu.json");
    host
}

fn mounts(fx: &Fixture, id: &str, host: &Path) -> Value {
    json!([
        {"hostPath": host.join("vgpu.json"), "containerPath": "/usr/local/tessera/vgpu.json",
         "options": ["ro", "nosuid", "nodev", "bind"]},
        {"hostPath": fx.path(&format!("state/alloc/{id}/accounting")), "containerPath": "/var/run/tessera",
         "options": ["rw", "nosuid", "nodev", "bind"]}
    ])
}

/// Writes the spec of allocation `alloc` (vgpu.json and the accounting
/// directory mounted), a bundle naming it that runs [`CHECK_SCRIPT`] with the
/// hook at `points`, and creates the container, which must succeed.
fn create_checked(fx: &Fixture, alloc: &str, points: &[&str], tag: &str) -> Run {
    let host = host_files(fx);
    fx.write_spec(
        &format!("tessera.io-alloc_{alloc}.json"),
        &alloc_spec(alloc, mounts(fx, alloc, &host)),
    );
    bundle_with_hooks(
        fx,
        json!({"tessera.io/alloc-id": alloc}),
        &[],
        CHECK_SCRIPT,
        points,
    );
    let (run, created, stderr) = Run::create(fx, tag);
    assert!(created.success(), "runc create: {stderr}");
    run
}

#[test]
fn legacy_injection_binds_and_unbinds_a_runc_container() {
    if !runc_available() {
        return;
    }
    let fx = Fixture::new();
    let alloc = "pod-1234-0";
    let run = create_checked(&fx, alloc, &["prestart", "createContainer"], "legacy");
    let pid = run.state()["pid"].as_u64().expect("pid");
    let b = binding(&fx, alloc).expect("binding.json after create");
    assert_eq!(b["containerId"], run.id.as_str());
    assert_eq!(b["pid"].as_u64(), Some(pid));
    assert_eq!(b["mode"], "legacy");
    assert!(
        b["cgroups"]["devices"]
            .as_str()
            .is_some_and(|p| p.ends_with(&run.id)),
        "{b}"
    );
    let acct =
        fs::metadata(fx.path(&format!("state/alloc/{alloc}/accounting"))).expect("accounting");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        (acct.uid(), acct.gid(), acct.mode() & 0o7777),
        (0, 0, 0o755)
    );

    let output = run.start_and_wait();
    assert_eq!(
        output,
        "crw-r----- 1000 1000 195, 12 /dev/nvidia-caps/nvidia-cap12\n\
         crw-rw-rw- 0 0 195, 0 /dev/nvidia0\n\
         crw-rw-rw- 0 0 195, 255 /dev/nvidiactl\n\
         {\"memoryLimitMiB\":8000}\n\
         vgpu.json-read-only\n\
         No such device or address\n\
         region-writable\n\
         accounting-dir-read-only\n\
         region-stays\n",
        "container output (opening the node reaches the driver: the cgroup allows it)"
    );
    // Nothing was made under the bundle's rootfs/dev on the host side.
    assert!(!fx.path("bundle/rootfs/dev/nvidia0").exists());

    drop(run);
    assert!(
        binding(&fx, alloc).is_none(),
        "poststop removes the binding record"
    );
    assert!(
        fx.path(&format!("state/alloc/{alloc}/accounting/vgpu.accounting"))
            .exists(),
        "the region survives the container"
    );
}

#[test]
fn a_failure_midway_leaves_no_host_state() {
    if !runc_available() {
        return;
    }
    let fx = Fixture::new();
    let alloc = "pod-5678-0";
    let spec_mounts = json!([{"hostPath": fx.path("no-such-file"), "containerPath": "/usr/local/tessera/x",
                              "options": ["ro", "bind"]}]);
    fx.write_spec(
        &format!("tessera.io-alloc_{alloc}.json"),
        &alloc_spec(alloc, spec_mounts),
    );
    bundle(&fx, json!({"tessera.io/alloc-id": alloc}), &[], "true");
    let (_run, created, stderr) = Run::create(&fx, "fail");
    assert!(!created.success(), "runc create must fail");
    assert!(
        stderr.contains("tessera-hook: bind source") && stderr.contains("exit status 6"),
        "{stderr}"
    );
    assert!(
        !fx.path(&format!("state/alloc/{alloc}")).exists(),
        "{:?}",
        fx.state_files()
    );
    assert!(
        !fx.path("bundle/rootfs/usr").exists(),
        "nothing created in the rootfs"
    );
}

#[test]
fn nvidia_visible_devices_uses_the_static_spec_when_enabled() {
    if !runc_available() {
        return;
    }
    let node = |p: &str, minor: u32| json!({"path": p, "type": "c", "major": 195, "minor": minor, "permissions": "rw"});
    let spec = json!({
        "cdiVersion": "0.5.0", "kind": "tessera.io/gpu",
        "devices": [
            {"name": "0", "containerEdits": {"deviceNodes": [node("/dev/nvidia0", 0)]}},
            {"name": "1", "containerEdits": {"deviceNodes": [node("/dev/nvidia1", 1)]}},
            {"name": "all", "containerEdits": {"deviceNodes": [node("/dev/nvidia0", 0), node("/dev/nvidia1", 1)]}}
        ],
        "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"], "deviceNodes": [node("/dev/nvidiactl", 255)],
                           "hooks": [{"hookName": "createContainer", "path": "/usr/bin/tessera-hook",
                                      "args": ["tessera-hook", "prestart"], "env": ["PATH=/usr/bin"]}]}
    });
    let script = "ls /dev | busybox grep nvidia | busybox tr '\\n' ' '";
    for (accept, expect) in [(false, ""), (true, "nvidia1 nvidiactl ")] {
        let fx = Fixture::new();
        fx.write_hook_toml(&format!("accept_nvidia_visible_devices = {accept}"));
        fx.write_spec("tessera.io-gpu.json", &spec);
        bundle(&fx, json!({}), &["NVIDIA_VISIBLE_DEVICES=1"], script);
        let (run, created, stderr) = Run::create(&fx, &format!("nvd-{accept}"));
        assert!(created.success(), "{stderr}");
        assert_eq!(run.start_and_wait(), expect, "accept = {accept}");
        assert!(
            fx.state_files().is_empty(),
            "no binding for NVIDIA_VISIBLE_DEVICES"
        );
    }
}

#[test]
fn a_create_container_hook_injects_from_inside_the_container() {
    if !runc_available() {
        return;
    }
    let fx = Fixture::new();
    let alloc = "pod-9-0";
    // runc runs createContainer hooks in the container's mount and pid
    // namespaces with pid 1 in the state: the hook finds the init as its parent.
    let run = create_checked(&fx, alloc, &["createContainer"], "inside");
    let pid = run.state()["pid"].as_u64().expect("pid");
    assert_eq!(
        binding(&fx, alloc).expect("binding")["pid"].as_u64(),
        Some(pid)
    );
    let output = run.start_and_wait();
    assert!(
        output.contains("195, 0 /dev/nvidia0\n") && output.contains("No such device or address"),
        "{output}"
    );
    assert!(
        output.contains("vgpu.json-read-only") && output.contains("region-writable"),
        "{output}"
    );
}
