//! Shared set-up of the interception tests: the built artefacts, a simulated
//! node, the limits file, and running `tessera-cuda-probe` (or another
//! program) with `libtessera_vgpu.so` preloaded.
//!
//! The artefacts come from the same target directory and profile as the
//! test binary: `cargo build --workspace` first (scripts/test.sh does). They,
//! and root for the simulated node's device nodes, are prerequisites by
//! `tessera-test-support`'s one rule: missing, a test skips and says so, or
//! fails under `CI` / `TESSERA_REQUIRE_ALL=1` (scripts/test.sh).
#![allow(dead_code)]

pub mod sequences;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::ops::Not;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tessera_test_support::node::SimNode;
#[allow(unused_imports, reason = "each test file uses a different part")]
pub use tessera_test_support::prereq::is_root;
#[allow(unused_imports, reason = "each test file uses a different part")]
pub use tessera_test_support::{Need, require};

/// The build outputs the tests run.
#[derive(Clone, Debug)]
pub struct Artefacts {
    /// `target/<profile>`.
    pub dir: PathBuf,
    /// `libtessera_vgpu.so`.
    pub lib: PathBuf,
    /// `tessera-cuda-probe` (dlopen + cuGetProcAddress or dlsym).
    pub probe: PathBuf,
    /// `tessera-cuda-probe-linked` (linked against libcuda.so.1).
    pub probe_linked: PathBuf,
}

/// The artefacts, or `None` after a skip when any is missing, when the
/// simulated node cannot be built here (root), or when a container limits
/// file on this machine would override the tests' own.
pub fn artefacts() -> Option<Artefacts> {
    let dir = tessera_test_support::target_dir();
    // A positive control runs the same tests against another build of the
    // library (scripts/control-vgpu-previous.sh): they must fail there.
    let lib = std::env::var_os("TESSERA_TEST_VGPU_LIBRARY")
        .filter(|p| !p.is_empty())
        .map_or_else(|| dir.join("libtessera_vgpu.so"), PathBuf::from);
    let a = Artefacts {
        lib,
        probe: dir.join("tessera-cuda-probe"),
        probe_linked: dir.join("tessera-cuda-probe-linked"),
        dir,
    };
    let mut needs = vec![
        Need::absent(
            tessera_model::contract::vgpu::CONTAINER_CONFIG_PATH,
            "it would override every test's limits",
        ),
        Need::Built("libtessera_vgpu.so"),
        Need::Built("tessera-cuda-probe"),
        Need::Built("tessera-cuda-probe-linked"),
    ];
    needs.extend(SimNode::profile("demo").needs());
    require(&needs).ok()?;
    Some(a)
}

/// Makes `dir` as the node side makes a container's accounting directory:
/// only its owner may write it, and it holds an empty region file every
/// user may open.
pub fn make_accounting_dir(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).expect("accounting dir");
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
        .expect("chmod accounting dir");
    tessera_vgpu::accounting::create_file(
        &dir.join(tessera_model::contract::vgpu::ACCOUNTING_FILE),
    )
    .expect("region file");
}

/// One device's limits in a limits file.
#[derive(Clone, Copy, Debug, Default)]
pub struct Limit {
    /// Index of the GPU in the node (NVML order).
    pub gpu: usize,
    /// MiB; 0: no memory limit.
    pub memory_mib: u64,
    /// Percent; 0: no SM limit.
    pub sm_percent: u32,
}

/// A simulated node in a temporary directory, with an accounting directory.
pub struct Node {
    /// The artefacts.
    pub a: Artefacts,
    _node: SimNode,
    /// Scratch directory (config files, programs).
    pub work: PathBuf,
    /// The node root.
    pub root: PathBuf,
    /// `<root>/usr/lib/x86_64-linux-gnu`, where the stand-ins are.
    pub libdir: PathBuf,
    /// The accounting directory named by the limits files written here.
    pub accounting: PathBuf,
    /// `GPU-…` uuids in the node's (NVML's and CUDA's default) order.
    pub uuids: Vec<String>,
    /// `MIG-…` uuids of the node's MIG devices, as `tessera-sim create` lists them.
    pub mig_uuids: Vec<String>,
}

/// Environment names cleared from every child, so the caller's environment
/// cannot change what a test sees.
const CLEARED_PREFIXES: &[&str] = &[
    "CUDA_DEVICE_",
    "CUDA_OVERSUBSCRIBE",
    "CUDA_VISIBLE_DEVICES",
    "LIBCUDA_LOG_LEVEL",
    "TESSERA_",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
];

impl Node {
    /// A simulated node of `profile` (`tessera-test-support`'s builder, as
    /// `tessera-sim create` lays it out), then the uuids from `probe info`.
    /// Call [`artefacts`] first: it requires what the node needs.
    pub fn create(a: Artefacts, profile: &str) -> Node {
        let sim = SimNode::profile(profile)
            .build()
            .unwrap_or_else(|skip| panic!("call artefacts() first: {}", skip.reason));
        let work = sim.dir().to_path_buf();
        let root = sim.root().to_path_buf();
        let accounting = work.join("accounting");
        make_accounting_dir(&accounting);
        let mut node = Node {
            libdir: sim.lib_dir(),
            mig_uuids: sim.mig_uuids(),
            a,
            _node: sim,
            work,
            root,
            accounting,
            uuids: Vec::new(),
        };
        let info = node.probe(None).arg("info").run();
        info.expect_success();
        let count: usize = info.get("device_count").parse().expect("device_count");
        node.uuids = (0..count)
            .map(|i| format!("GPU-{}", info.get(&format!("device.{i}.uuid"))))
            .collect();
        node
    }

    /// Writes a limits file with these devices (and extra top-level JSON
    /// fields, e.g. `"oversubscribe": true`) and returns its path.
    pub fn limits(&self, name: &str, devices: &[Limit], extra: &str) -> PathBuf {
        let devices: Vec<String> = devices
            .iter()
            .map(|l| {
                format!(
                    r#"{{"uuid": "{}", "memoryLimitMiB": {}, "smLimitPercent": {}}}"#,
                    self.uuids[l.gpu], l.memory_mib, l.sm_percent
                )
            })
            .collect();
        let extra = if extra.is_empty() {
            String::new()
        } else {
            format!(", {extra}")
        };
        let text = format!(
            r#"{{"version": 1, "devices": [{}], "accountingDir": "{}"{extra}}}"#,
            devices.join(", "),
            self.accounting.display()
        );
        self.write(name, &text)
    }

    /// Writes `vgpu.json` with a `mib` MiB memory limit on GPU 0 (no SM
    /// limit) and returns its path.
    pub fn gpu0_slice(&self, mib: u64) -> PathBuf {
        self.limits(
            "vgpu.json",
            &[Limit {
                gpu: 0,
                memory_mib: mib,
                sm_percent: 0,
            }],
            "",
        )
    }

    /// Writes the limits file `<name>.json` of a container of its own on
    /// this node: its own accounting directory (`<name>-accounting`, made
    /// as the node side makes it), so its processes share nothing with the
    /// other containers' but the device. Returns the file's path.
    pub fn container(&self, name: &str, devices: &[Limit]) -> PathBuf {
        let accounting = self.work.join(format!("{name}-accounting"));
        make_accounting_dir(&accounting);
        let devices: Vec<String> = devices
            .iter()
            .map(|l| {
                format!(
                    r#"{{"uuid": "{}", "memoryLimitMiB": {}, "smLimitPercent": {}}}"#,
                    self.uuids[l.gpu], l.memory_mib, l.sm_percent
                )
            })
            .collect();
        let text = format!(
            r#"{{"version": 1, "devices": [{}], "accountingDir": "{}"}}"#,
            devices.join(", "),
            accounting.display()
        );
        self.write(&format!("{name}.json"), &text)
    }

    /// Writes a limits file naming devices by uuid: `(uuid, memory MiB)`.
    pub fn limits_by_uuid(&self, name: &str, devices: &[(&str, u64)]) -> PathBuf {
        let devices: Vec<String> = devices
            .iter()
            .map(|(uuid, mib)| format!(r#"{{"uuid": "{uuid}", "memoryLimitMiB": {mib}}}"#))
            .collect();
        let text = format!(
            r#"{{"version": 1, "devices": [{}], "accountingDir": "{}"}}"#,
            devices.join(", "),
            self.accounting.display()
        );
        self.write(name, &text)
    }

    /// Writes a file in the scratch directory.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.work.join(name);
        std::fs::write(&path, text).expect("write file");
        path
    }

    /// A command for `program` with the node's libraries on the loader
    /// path and, with `limits`, the library preloaded and that limits file
    /// named (`TESSERA_VGPU_CONFIG`, honoured because the container file
    /// does not exist).
    pub fn command(&self, program: &Path, limits: Option<&Path>) -> Probe {
        let mut cmd = Command::new(program);
        for (key, _) in std::env::vars_os() {
            let key_text = key.to_string_lossy();
            if CLEARED_PREFIXES.iter().any(|p| key_text.starts_with(p)) {
                cmd.env_remove(&key);
            }
        }
        cmd.env("LD_LIBRARY_PATH", &self.libdir);
        if let Some(limits) = limits {
            cmd.env("LD_PRELOAD", &self.a.lib);
            cmd.env("TESSERA_VGPU_CONFIG", limits);
        }
        Probe(cmd)
    }

    /// [`Node::command`] for `tessera-cuda-probe`.
    pub fn probe(&self, limits: Option<&Path>) -> Probe {
        self.command(&self.a.probe, limits)
    }

    /// [`Node::command`] for `tessera-cuda-probe-linked`.
    pub fn probe_linked(&self, limits: Option<&Path>) -> Probe {
        self.command(&self.a.probe_linked, limits)
    }

    /// Compiles the C program `tests/c/<name>.c` into the scratch
    /// directory as `output`, with extra compiler arguments; `None` after a
    /// skip without a C compiler.
    pub fn compile_c(&self, name: &str, output: &str, extra: &[&str]) -> Option<PathBuf> {
        require(&[Need::Program("cc")]).ok()?;
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
        let out = self.work.join(output);
        let result = Command::new("cc")
            .arg("-O1")
            .arg("-o")
            .arg(&out)
            .arg(&source)
            .args(extra)
            .arg("-ldl")
            .output();
        match result {
            Ok(o) if o.status.success() => Some(out),
            Ok(o) => panic!(
                "cc {} failed: {}",
                source.display(),
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => panic!("running cc: {e}"),
        }
    }
}

/// A command about to run.
pub struct Probe(pub Command);

impl Probe {
    /// Adds an argument.
    pub fn arg(mut self, arg: impl AsRef<std::ffi::OsStr>) -> Probe {
        self.0.arg(arg);
        self
    }

    /// Adds arguments.
    pub fn args<I, S>(mut self, args: I) -> Probe
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        self.0.args(args);
        self
    }

    /// Sets an environment variable.
    pub fn env(mut self, key: &str, value: impl AsRef<std::ffi::OsStr>) -> Probe {
        self.0.env(key, value);
        self
    }

    /// Runs to completion.
    pub fn run(mut self) -> Output {
        let described = format!("{:?}", self.0);
        let out = self
            .0
            .output()
            .unwrap_or_else(|e| panic!("run {described}: {e}"));
        Output::new(
            described,
            out.status,
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Starts it, output captured; [`Running::wait`] collects it.
    pub fn spawn(mut self) -> Running {
        let described = format!("{:?}", self.0);
        let child = self
            .0
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {described}: {e}"));
        Running { child, described }
    }

    /// Starts it and waits until it prints `state=holding` (an `alloc
    /// --hold-secs` probe with its blocks allocated); the lines so far.
    pub fn start_holding(mut self) -> Holding {
        let described = format!("{:?}", self.0);
        let mut child = self
            .0
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {described}: {e}"));
        let stdout = child.stdout.take().expect("stdout");
        let mut reader = BufReader::new(stdout);
        let mut seen = String::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(n) if n > 0 => {
                    let line = line.trim_end();
                    seen.push_str(line);
                    seen.push('\n');
                    if line == "state=holding" {
                        break;
                    }
                }
                _ => {
                    let _ = child.kill();
                    let out = child.wait_with_output().expect("wait");
                    panic!(
                        "{described} ended before holding: {}\nstdout:\n{seen}\nstderr:\n{}",
                        out.status,
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
            }
            assert!(
                Instant::now() < deadline,
                "{described}: no state=holding in 30 s"
            );
        }
        Holding {
            child,
            reader,
            described,
            seen,
        }
    }
}

/// A program started by [`Probe::spawn`].
pub struct Running {
    /// The process.
    pub child: Child,
    described: String,
}

impl Running {
    /// Its pid (the host's: the tests run in the host's pid namespace).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for it to end and collects its output.
    pub fn wait(self) -> Output {
        let out = self
            .child
            .wait_with_output()
            .unwrap_or_else(|e| panic!("wait for {}: {e}", self.described));
        Output::new(
            self.described,
            out.status,
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

/// A probe holding its allocations.
pub struct Holding {
    /// The process.
    pub child: Child,
    /// Its stdout, kept open so it can go on printing.
    reader: BufReader<std::process::ChildStdout>,
    described: String,
    /// Its stdout up to `state=holding`.
    pub seen: String,
}

impl Holding {
    /// The key=value lines printed before holding.
    pub fn output(&self) -> BTreeMap<String, String> {
        parse(&self.seen)
    }

    /// Waits for it to end.
    pub fn wait(mut self) -> Output {
        let _ = std::io::Read::read_to_string(&mut self.reader, &mut self.seen);
        let status = self.child.wait().expect("wait");
        let mut stderr = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
        }
        Output::new(
            std::mem::take(&mut self.described),
            status,
            std::mem::take(&mut self.seen),
            stderr,
        )
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn parse(stdout: &str) -> BTreeMap<String, String> {
    stdout
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// What a program printed.
pub struct Output {
    described: String,
    /// Exit status.
    pub status: std::process::ExitStatus,
    /// Stdout.
    pub stdout: String,
    /// Stderr.
    pub stderr: String,
    /// Stdout's key=value lines.
    pub kv: BTreeMap<String, String>,
}

impl Output {
    fn new(
        described: String,
        status: std::process::ExitStatus,
        stdout: String,
        stderr: String,
    ) -> Output {
        Output {
            kv: parse(&stdout),
            described,
            status,
            stdout,
            stderr,
        }
    }

    /// Everything, for assertion messages.
    pub fn describe(&self) -> String {
        format!(
            "{}\nexit: {}\nstdout:\n{}stderr:\n{}",
            self.described, self.status, self.stdout, self.stderr
        )
    }

    /// The value of `key`; fails the test, showing the output, without it.
    pub fn get(&self, key: &str) -> &str {
        self.kv
            .get(key)
            .unwrap_or_else(|| panic!("no {key}= line in the output of {}", self.describe()))
    }

    /// The value of `key` as a number.
    pub fn num(&self, key: &str) -> u64 {
        self.get(key)
            .parse()
            .unwrap_or_else(|_| panic!("{key} is not a number in {}", self.describe()))
    }

    /// The value of `key` as a float.
    pub fn float(&self, key: &str) -> f64 {
        self.get(key)
            .parse()
            .unwrap_or_else(|_| panic!("{key} is not a number in {}", self.describe()))
    }

    /// Fails the test unless the program succeeded.
    pub fn expect_success(&self) {
        assert!(
            self.status.success(),
            "expected success: {}",
            self.describe()
        );
    }

    /// Lines the library printed on stderr.
    pub fn library_lines(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter(|l| l.starts_with("tessera-vgpu:"))
            .collect()
    }
}

/// MiB.
pub const MIB: u64 = 1 << 20;

/// The results of a `tessera-cuda-probe script` run, step by step:
/// `(op, CUresult name)`.
pub fn steps(out: &Output) -> Vec<(String, String)> {
    let mut steps: Vec<(usize, String, String)> = out
        .kv
        .iter()
        .filter_map(|(k, v)| {
            let n = k.strip_prefix("step.")?.parse().ok()?;
            let (op, rc) = v.split_once(' ')?;
            Some((n, op.to_owned(), rc.to_owned()))
        })
        .collect();
    steps.sort();
    steps.into_iter().map(|(_, op, rc)| (op, rc)).collect()
}

/// Asserts each step's result: `expected[i]` is `"ok"` (CUDA_SUCCESS) or
/// `"oom"` (CUDA_ERROR_OUT_OF_MEMORY).
pub fn expect_steps(out: &Output, expected: &[&str]) {
    let got = steps(out);
    let want: Vec<&str> = expected
        .iter()
        .map(|e| match *e {
            "ok" => "CUDA_SUCCESS",
            "oom" => "CUDA_ERROR_OUT_OF_MEMORY",
            other => other,
        })
        .collect();
    let got_codes: Vec<&str> = got.iter().map(|(_, rc)| rc.as_str()).collect();
    assert_eq!(got_codes, want, "steps {:?}\n{}", got, out.describe());
}

/// Bytes the simulated GPU `gpu` of the node at `root` holds for its live
/// processes, and how many there are, from the newest sample each published
/// (`TESSERA_SIM_CUDA_PUBLISH_ON_MEMORY=1` makes that exact once a call
/// returned). Read from the utilization files the CUDA stand-in writes
/// (`<root>/run/tessera-sim/util/gpu<N>-<pid>`: 64-byte header, then 128
/// slots of six u64 — seq, mono, real, busy, mem, check), with the
/// layout's own integrity word; a slot caught mid-write is skipped.
pub fn held_on_gpu(root: &Path, gpu: u32) -> (u64, usize) {
    held_by(root, gpu, None)
}

/// [`held_on_gpu`] counting only the processes in `only` (when given).
pub fn held_by(root: &Path, gpu: u32, only: Option<&[u32]>) -> (u64, usize) {
    let Ok(entries) = std::fs::read_dir(root.join("run/tessera-sim/util")) else {
        return (0, 0);
    };
    let prefix = format!("gpu{gpu}-");
    let mut total = 0u64;
    let mut count = 0usize;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        if only.is_some_and(|pids| !pids.contains(&(pid as u32))) {
            continue;
        }
        // A process that is gone holds nothing (its file stays behind).
        let alive = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .map(|(_, rest)| rest.trim_start().starts_with(['Z', 'X']).not())
            })
            .unwrap_or(false);
        if !alive {
            continue;
        }
        let Ok(bytes) = std::fs::read(entry.path()) else {
            continue;
        };
        let word = |at: usize| {
            bytes
                .get(at..at + 8)
                .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
                .unwrap_or(0)
        };
        let newest = (0..128)
            .map(|i| 64 + i * 48)
            .filter_map(|at| {
                let (seq, mono, real, busy, mem, check) = (
                    word(at),
                    word(at + 8),
                    word(at + 16),
                    word(at + 24),
                    word(at + 32),
                    word(at + 40),
                );
                let expected = seq
                    ^ mono.rotate_left(13)
                    ^ real.rotate_left(29)
                    ^ busy.rotate_left(41)
                    ^ mem.rotate_left(53)
                    ^ 0x9E37_79B9_7F4A_7C15;
                (seq > 0 && check == expected).then_some((seq, mem))
            })
            .max();
        if let Some((_, mem)) = newest {
            total += mem;
            count += 1;
        }
    }
    (total, count)
}
