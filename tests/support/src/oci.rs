//! OCI bundles and the low-level runtimes (runc, crun) driven directly, the way
//! engines without CDI run containers: `create`, `start`, `state`, `delete`.
//!
//! A [`Container`] deletes itself (`delete -f`) when dropped, so a failing
//! assertion does not leave a container (and its mounts) behind.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::run;

/// A low-level OCI runtime from the distribution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    /// runc (Debian 12: 1.1.5).
    Runc,
    /// crun (Debian 12: 1.8.1).
    Crun,
}

impl Runtime {
    /// Both runtimes, in the order tests run them.
    pub const ALL: [Runtime; 2] = [Runtime::Runc, Runtime::Crun];

    /// The program name.
    pub fn program(self) -> &'static str {
        match self {
            Runtime::Runc => "runc",
            Runtime::Crun => "crun",
        }
    }
}

impl std::fmt::Display for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.program())
    }
}

/// A container id unique to this process and call.
pub fn unique_id(tag: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "tessera-e2e-{tag}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// An OCI hook entry as it sits in `config.json`.
#[derive(Debug, Clone)]
pub struct HookEntry {
    /// Absolute path of the executable.
    pub path: PathBuf,
    /// argv, with argv\[0\].
    pub args: Vec<String>,
    /// The whole environment; `None` leaves `env` out (the runtime then decides).
    pub env: Option<Vec<String>>,
}

impl HookEntry {
    fn to_json(&self) -> Value {
        let mut hook = json!({
            "path": self.path.to_string_lossy(),
            "args": self.args,
            "timeout": 20,
        });
        if let Some(env) = &self.env {
            hook["env"] = json!(env);
        }
        hook
    }
}

/// A bundle directory made by `runc spec`, with a busybox rootfs beside it.
pub struct Bundle {
    dir: PathBuf,
    config: Value,
}

impl Bundle {
    /// Makes `dir/config.json` with `runc spec` around the existing `dir/rootfs`,
    /// then sets what the tests need: no terminal, a writable rootfs (so that a
    /// refused write proves a read-only mount), and `/bin/sh -c script`.
    pub fn new(dir: &Path, script: &str) -> Result<Self> {
        let config_path = dir.join("config.json");
        let _ = fs::remove_file(&config_path);
        run(Command::new("runc").arg("spec").arg("--bundle").arg(dir))?;
        let mut config: Value = serde_json::from_slice(&fs::read(&config_path)?)
            .with_context(|| config_path.display().to_string())?;
        config["process"]["terminal"] = json!(false);
        config["process"]["args"] = json!(["/bin/sh", "-c", script]);
        config["root"]["readonly"] = json!(false);
        Ok(Self {
            dir: dir.to_owned(),
            config,
        })
    }

    /// The bundle directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The rootfs directory (`<bundle>/rootfs`).
    pub fn rootfs(&self) -> PathBuf {
        self.dir.join("rootfs")
    }

    /// The config as JSON, for edits the helpers do not cover.
    pub fn config_mut(&mut self) -> &mut Value {
        &mut self.config
    }

    /// Replaces the `linux.namespaces` entry of `kind`: `None` removes it
    /// (the container shares the runtime's), `Some(None)` asks for a new one,
    /// `Some(Some(path))` joins the namespace at `path`.
    pub fn set_namespace(&mut self, kind: &str, request: Option<Option<&str>>) -> &mut Self {
        let namespaces = &mut self.config["linux"]["namespaces"];
        let mut list: Vec<Value> = namespaces
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|n| n["type"] != kind)
            .collect();
        match request {
            None => {}
            Some(None) => list.push(json!({"type": kind})),
            Some(Some(path)) => list.push(json!({"type": kind, "path": path})),
        }
        *namespaces = json!(list);
        self
    }

    /// Sets an annotation.
    pub fn annotate(&mut self, key: &str, value: &str) -> &mut Self {
        if !self.config["annotations"].is_object() {
            self.config["annotations"] = json!({});
        }
        self.config["annotations"][key] = json!(value);
        self
    }

    /// Appends `KEY=VALUE` to the process environment.
    pub fn env(&mut self, entry: &str) -> &mut Self {
        if let Some(env) = self.config["process"]["env"].as_array_mut() {
            env.push(json!(entry));
        }
        self
    }

    /// Appends a hook at `stage` (`prestart`, `createContainer`, `poststop`, …).
    pub fn hook(&mut self, stage: &str, entry: &HookEntry) -> &mut Self {
        if !self.config["hooks"].is_object() {
            self.config["hooks"] = json!({});
        }
        let hooks = &mut self.config["hooks"][stage];
        if !hooks.is_array() {
            *hooks = json!([]);
        }
        if let Some(list) = hooks.as_array_mut() {
            list.push(entry.to_json());
        }
        self
    }

    /// Removes every hook.
    pub fn clear_hooks(&mut self) -> &mut Self {
        if let Some(config) = self.config.as_object_mut() {
            config.remove("hooks");
        }
        self
    }

    /// Writes `config.json`.
    pub fn write(&self) -> Result<()> {
        fs::write(
            self.dir.join("config.json"),
            serde_json::to_vec_pretty(&self.config)?,
        )?;
        Ok(())
    }
}

/// A container made with `<runtime> create`; deleted (forcibly) on drop.
pub struct Container {
    runtime: Runtime,
    id: String,
    stdout: PathBuf,
    deleted: bool,
}

/// What `<runtime> create` said when it failed.
#[derive(Debug)]
pub struct CreateFailed {
    /// The runtime's stderr (hook errors are reported there).
    pub stderr: String,
}

impl Container {
    /// `<runtime> create --bundle <bundle> <id>`: runs the prestart and
    /// createContainer hooks and stops before the process starts. The
    /// container's stdout and stderr go to files in the bundle directory.
    pub fn create(runtime: Runtime, bundle: &Bundle, id: &str) -> Result<Self, CreateFailed> {
        bundle.write().map_err(|e| CreateFailed {
            stderr: format!("writing config.json: {e:#}"),
        })?;
        let stdout = bundle.dir().join(format!("{id}.stdout"));
        let runtime_err = bundle.dir().join(format!("{id}.runtime-stderr"));
        let files = fs::File::create(&stdout)
            .and_then(|out| Ok((out, fs::File::create(&runtime_err)?)))
            .map_err(|e| CreateFailed {
                stderr: format!("creating output files: {e}"),
            })?;
        let status = Command::new(runtime.program())
            .arg("create")
            .arg("--bundle")
            .arg(bundle.dir())
            .arg(id)
            .stdin(Stdio::null())
            .stdout(files.0)
            .stderr(files.1)
            .status();
        let mut container = Container {
            runtime,
            id: id.to_owned(),
            stdout,
            deleted: false,
        };
        match status {
            Ok(s) if s.success() => Ok(container),
            Ok(s) => {
                let stderr = fs::read_to_string(&runtime_err).unwrap_or_default();
                container.force_delete();
                Err(CreateFailed {
                    stderr: format!("{runtime} create exited with {s}: {stderr}"),
                })
            }
            Err(e) => {
                container.deleted = true;
                Err(CreateFailed {
                    stderr: format!("spawning {runtime}: {e}"),
                })
            }
        }
    }

    /// The container id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The init process's pid on the host, from `<runtime> state`.
    pub fn pid(&self) -> Result<u32> {
        let state = self.state()?;
        state["pid"]
            .as_u64()
            .map(|p| p as u32)
            .context("state has no pid")
    }

    /// `<runtime> state <id>` as JSON.
    pub fn state(&self) -> Result<Value> {
        let out = run(Command::new(self.runtime.program())
            .arg("state")
            .arg(&self.id))?;
        Ok(serde_json::from_slice(&out.stdout)?)
    }

    /// Starts the process and waits until it has exited.
    pub fn start_and_wait(&self, timeout: Duration) -> Result<()> {
        run(Command::new(self.runtime.program())
            .arg("start")
            .arg(&self.id))?;
        let deadline = Instant::now() + timeout;
        loop {
            let status = self.state()?["status"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if status == "stopped" {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "{} container {} still {status} after {timeout:?}",
                    self.runtime,
                    self.id
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// What the process wrote to stdout and stderr (they share a file).
    pub fn output(&self) -> String {
        fs::read_to_string(&self.stdout).unwrap_or_default()
    }

    /// `<runtime> delete <id>`: runs the poststop hooks. If it fails, the
    /// drop still deletes the container forcibly.
    pub fn delete(mut self) -> Result<()> {
        run(Command::new(self.runtime.program())
            .arg("delete")
            .arg(&self.id))?;
        self.deleted = true;
        Ok(())
    }

    fn force_delete(&mut self) {
        if !self.deleted {
            self.deleted = true;
            let _ = Command::new(self.runtime.program())
                .args(["delete", "-f"])
                .arg(&self.id)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        self.force_delete();
    }
}

/// The result of running a bundle to its end: create, start, wait, delete.
#[derive(Debug)]
pub struct RunOutcome {
    /// `None` if the container ran; the runtime's error if create failed.
    pub create_error: Option<String>,
    /// The container's output (empty if it did not run).
    pub output: String,
}

/// Runs a bundle from create to delete, tolerating a refused create (a hook
/// that fails stops the container there, which hostile-rootfs tests expect).
pub fn run_bundle(runtime: Runtime, bundle: &Bundle, tag: &str) -> Result<RunOutcome> {
    run_bundle_as(runtime, bundle, &unique_id(tag))
}

/// [`run_bundle`] with the container id chosen by the caller (from
/// [`unique_id`]), so a test can look for what a hook recorded about that
/// very container.
pub fn run_bundle_as(runtime: Runtime, bundle: &Bundle, id: &str) -> Result<RunOutcome> {
    let container = match Container::create(runtime, bundle, id) {
        Ok(c) => c,
        Err(e) => {
            return Ok(RunOutcome {
                create_error: Some(e.stderr),
                output: String::new(),
            });
        }
    };
    let started = container.start_and_wait(Duration::from_secs(20));
    let output = container.output();
    if let Err(e) = started {
        // A process that fails to start (hostile rootfs) is an outcome, not a harness error.
        return Ok(RunOutcome {
            create_error: Some(format!("start: {e:#}")),
            output,
        });
    }
    container.delete()?;
    Ok(RunOutcome {
        create_error: None,
        output,
    })
}
