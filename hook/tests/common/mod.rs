//! Helpers of the hook's own integration tests: a fixture directory (CDI
//! dir, state dir, hook.toml, bundle) and runs of the static binary with an
//! OCI state on stdin. The binary, the prerequisite rule and busybox come
//! from `tessera-test-support`.
#![allow(dead_code)]

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};
#[allow(unused_imports, reason = "each test file uses a different part")]
pub use tessera_test_support::{Need, hook_binary, require};

/// A temporary tree: `cdi/`, `state/`, `hook.toml`, `bundle/` (config.json + rootfs/).
pub struct Fixture {
    pub dir: tempfile::TempDir,
}

impl Fixture {
    /// An empty fixture with a default `hook.toml` pointing at its own dirs.
    pub fn new() -> Fixture {
        let dir = tempfile::Builder::new()
            .prefix("tessera-hook-test")
            .tempdir()
            .expect("tempdir");
        let fx = Fixture { dir };
        for d in ["cdi", "state", "bundle/rootfs"] {
            fs::create_dir_all(fx.path(d)).expect("mkdir");
        }
        // tempfile makes the top directory 0700; the bundle path must stay traversable.
        fs::set_permissions(fx.dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
        fx.write_hook_toml("");
        fx
    }

    /// A path inside the fixture.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Writes `hook.toml` with `cdi_dir` and `state_dir` set, plus `extra` lines.
    pub fn write_hook_toml(&self, extra: &str) {
        let text = format!(
            "cdi_dir = {:?}\nstate_dir = {:?}\n{extra}\n",
            self.path("cdi"),
            self.path("state")
        );
        fs::write(self.path("hook.toml"), text).expect("hook.toml");
    }

    /// Writes the bundle's `config.json`.
    pub fn write_config(&self, config: &Value) {
        fs::write(self.path("bundle/config.json"), config.to_string()).expect("config.json");
    }

    /// Writes a spec file into the CDI dir (mode 0644).
    pub fn write_spec(&self, name: &str, spec: &Value) -> PathBuf {
        let path = self.path(&format!("cdi/{name}"));
        fs::write(&path, spec.to_string()).expect("spec");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).expect("chmod");
        path
    }

    /// An OCI state for the fixture's bundle.
    pub fn state(&self, id: &str, pid: Option<u32>) -> String {
        let mut s = json!({"ociVersion": "1.0.2", "id": id, "status": "creating",
                           "bundle": self.path("bundle")});
        if let Some(pid) = pid {
            s["pid"] = json!(pid);
        }
        s.to_string()
    }

    /// Runs the hook binary with `args` and `stdin`, with the fixture's hook.toml.
    pub fn run(&self, verb: &str, stdin: &str) -> Output {
        run_hook(
            &[
                "--config",
                self.path("hook.toml").to_str().expect("utf-8"),
                verb,
            ],
            stdin,
        )
    }

    /// Runs the hook the way runc runs a `createContainer` hook: as the child
    /// of a stand-in container init that `unshare` puts in new mount and pid
    /// namespaces, with the bundle's rootfs bind-mounted on itself and a procfs
    /// under it, as the runtime leaves them (the host's `/proc` stays at
    /// `/proc`). The state names `state_pid` (runc: 1). Returns the hook's
    /// output and the stand-in init's host pid, which the hook must find.
    pub fn run_inside(&self, verb: &str, id: &str, state_pid: Option<u32>) -> (Output, u32) {
        let state_file = self.path(&format!("state-{id}.json"));
        fs::write(&state_file, self.state(id, state_pid)).expect("state file");
        let rootfs = self.path("bundle/rootfs");
        fs::create_dir_all(rootfs.join("proc")).expect("rootfs/proc");
        // `read < /proc/self/stat` is the shell itself (a builtin, no fork): its host pid.
        let script = r#"set -e
mount --make-rprivate /
mount --bind "$1" "$1"
mount -t proc proc "$1/proc"
read -r host_pid rest < /proc/self/stat
echo "INIT_HOST_PID=$host_pid" >&2
set +e
"$2" --config "$3" "$4" < "$5"
rc=$?
exit $rc
"#;
        let out = Command::new("unshare")
            .args(["--mount", "--pid", "--fork", "--", "sh", "-c", script, "sh"])
            .arg(&rootfs)
            .arg(hook_binary())
            .arg(self.path("hook.toml"))
            .arg(verb)
            .arg(&state_file)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .output()
            .expect("running unshare (util-linux)");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let pid = stderr
            .lines()
            .find_map(|l| l.strip_prefix("INIT_HOST_PID="))
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("the stand-in init did not start: {stderr}"));
        let hook_stderr: String = stderr
            .lines()
            .filter(|l| !l.starts_with("INIT_HOST_PID="))
            .map(|l| format!("{l}\n"))
            .collect();
        (
            Output {
                status: out.status,
                stdout: out.stdout,
                stderr: hook_stderr.into_bytes(),
            },
            pid,
        )
    }

    /// Every file under the state dir, relative.
    pub fn state_files(&self) -> Vec<String> {
        let mut out = Vec::new();
        walk(&self.path("state"), &self.path("state"), &mut out);
        out.sort();
        out
    }
}

fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = entry.path();
        out.push(p.strip_prefix(base).expect("prefix").display().to_string());
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            walk(base, &p, out);
        }
    }
}

/// Runs the hook binary with `args`, `stdin` on its standard input, an empty environment.
pub fn run_hook(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(hook_binary())
        .args(args)
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning tessera-hook");
    {
        let mut input = child.stdin.take().expect("stdin");
        // The hook may exit before reading everything (a refused state); ignore EPIPE.
        let _ = input.write_all(stdin.as_bytes());
    }
    child.wait_with_output().expect("waiting for tessera-hook")
}

/// The exit code and stderr of a run, for assertions.
pub fn code_and_stderr(out: &Output) -> (i32, String) {
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A minimal OCI config with `annotations` and `env`.
pub fn config_json(annotations: Value, env: &[&str]) -> Value {
    json!({
        "ociVersion": "1.0.2",
        "process": {"user": {"uid": 0, "gid": 0}, "args": ["/bin/sh"], "env": env, "cwd": "/"},
        "root": {"path": "rootfs"},
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
        "annotations": annotations,
        "linux": {"namespaces": [{"type": "mount"}, {"type": "pid"}]}
    })
}

/// A complete transient spec for `id` (the contract: `TESSERA_ALLOC_ID` and
/// both hook entries with env) with one GPU node and a spec-level control node.
pub fn alloc_spec(id: &str, mounts: Value) -> Value {
    json!({
        "cdiVersion": "0.5.0",
        "kind": "tessera.io/alloc",
        "devices": [{"name": id, "containerEdits": {
            "env": [format!("TESSERA_ALLOC_ID={id}")],
            "deviceNodes": [
                {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0, "permissions": "rw"},
                {"path": "/dev/nvidia-caps/nvidia-cap12", "type": "c", "major": 195, "minor": 12,
                 "permissions": "rw", "fileMode": 0o640, "uid": 1000, "gid": 1000}
            ],
            "mounts": mounts
        }}],
        "containerEdits": {
            "deviceNodes": [{"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255, "permissions": "rw"}],
            "hooks": [{"hookName": "createContainer", "path": "/usr/bin/tessera-hook",
                       "args": ["tessera-hook", "prestart"], "env": ["PATH=/usr/bin"]},
                      {"hookName": "poststop", "path": "/usr/bin/tessera-hook",
                       "args": ["tessera-hook", "poststop"], "env": ["PATH=/usr/bin"]}]
        }
    })
}
