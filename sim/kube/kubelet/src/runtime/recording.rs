//! A [`ContainerRuntime`] that runs nothing: it records every request (as a
//! JSON line in a file for `--dry-run`, and in memory for the unit tests)
//! and pretends: a started container runs until it is stopped, or until a
//! test makes it exit. With a file, a new one replays the file first, so
//! what ran before a kubelet restart still runs (as a real runtime's
//! containers outlive the kubelet).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use super::{
    ContainerConfig, ContainerInfo, ContainerRuntime, ContainerState, ContainerStatus,
    RuntimeError, RuntimeResult, RuntimeVersion, SandboxConfig, SandboxInfo,
};

/// The version the recording runtime reports.
pub const VERSION: &str = "0.1.0";

#[derive(Debug)]
struct FakeSandbox {
    config: SandboxConfig,
    ready: bool,
}

#[derive(Debug)]
struct FakeContainer {
    sandbox_id: String,
    config: ContainerConfig,
    state: ContainerState,
    created_at: i64,
    started_at: i64,
    finished_at: i64,
    exit_code: i32,
    reason: String,
}

#[derive(Debug, Default)]
struct Fake {
    next_id: u64,
    sandboxes: BTreeMap<String, FakeSandbox>,
    containers: BTreeMap<String, FakeContainer>,
    calls: Vec<Value>,
    failures: BTreeMap<String, String>,
    missing_images: BTreeSet<String>,
}

impl Fake {
    fn id(&mut self, kind: &str) -> String {
        self.next_id += 1;
        format!("{kind}{:08x}", self.next_id)
    }

    fn run_sandbox(&mut self, config: SandboxConfig) -> String {
        let id = self.id("sandbox");
        self.sandboxes.insert(
            id.clone(),
            FakeSandbox {
                config,
                ready: true,
            },
        );
        id
    }

    fn stop_sandbox(&mut self, id: &str) {
        if let Some(s) = self.sandboxes.get_mut(id) {
            s.ready = false;
        }
        for c in self.containers.values_mut() {
            if c.sandbox_id == id && c.state == ContainerState::Running {
                c.state = ContainerState::Exited;
                c.finished_at = now_ns();
                c.exit_code = 137;
            }
        }
    }

    fn remove_sandbox(&mut self, id: &str) {
        self.sandboxes.remove(id);
        self.containers.retain(|_, c| c.sandbox_id != id);
    }

    fn create_container(
        &mut self,
        sandbox_id: &str,
        config: ContainerConfig,
    ) -> RuntimeResult<String> {
        if !self.sandboxes.contains_key(sandbox_id) {
            return Err(RuntimeError::NotFound {
                call: "CreateContainer",
                message: format!("sandbox {sandbox_id}"),
            });
        }
        let id = self.id("container");
        self.containers.insert(
            id.clone(),
            FakeContainer {
                sandbox_id: sandbox_id.to_owned(),
                config,
                state: ContainerState::Created,
                created_at: now_ns(),
                started_at: 0,
                finished_at: 0,
                exit_code: 0,
                reason: String::new(),
            },
        );
        Ok(id)
    }

    fn start_container(&mut self, id: &str) -> RuntimeResult<()> {
        match self.containers.get_mut(id) {
            Some(c) => {
                c.state = ContainerState::Running;
                c.started_at = now_ns();
                Ok(())
            }
            None => Err(RuntimeError::NotFound {
                call: "StartContainer",
                message: format!("container {id}"),
            }),
        }
    }

    fn stop_container(&mut self, id: &str) {
        if let Some(c) = self.containers.get_mut(id)
            && c.state == ContainerState::Running
        {
            c.state = ContainerState::Exited;
            c.finished_at = now_ns();
            c.exit_code = 137;
            c.reason = "Error".to_owned();
        }
    }

    /// Applies one recorded line again (ids come out the same: they are
    /// handed out in call order). Calls that change nothing are skipped.
    fn replay(&mut self, line: &Value) -> Result<(), String> {
        let request = &line["request"];
        let id = |field: &str| request[field].as_str().unwrap_or_default().to_owned();
        let config = |field: &str| request.get(field).cloned().unwrap_or(Value::Null);
        match line["call"].as_str().unwrap_or_default() {
            "RunPodSandbox" => {
                let config = serde_json::from_value(config("config")).map_err(|e| e.to_string())?;
                self.run_sandbox(config);
            }
            "StopPodSandbox" => self.stop_sandbox(&id("pod_sandbox_id")),
            "RemovePodSandbox" => self.remove_sandbox(&id("pod_sandbox_id")),
            "CreateContainer" => {
                let config = serde_json::from_value(config("config")).map_err(|e| e.to_string())?;
                // A create that failed then fails again, handing out no id.
                let _ = self.create_container(&id("pod_sandbox_id"), config);
            }
            "StartContainer" => {
                let _ = self.start_container(&id("container_id"));
            }
            "StopContainer" => self.stop_container(&id("container_id")),
            "RemoveContainer" => {
                self.containers.remove(&id("container_id"));
            }
            _ => {}
        }
        Ok(())
    }
}

/// The recording runtime.
#[derive(Debug, Default)]
pub struct RecordingRuntime {
    file: Option<Mutex<File>>,
    fake: Mutex<Fake>,
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

impl RecordingRuntime {
    /// One that records in memory only.
    pub fn new() -> RecordingRuntime {
        RecordingRuntime::default()
    }

    /// One that also appends each request as a JSON line to `path`, after
    /// replaying what `path` already records (a kubelet restart).
    pub fn to_file(path: &Path) -> std::io::Result<RecordingRuntime> {
        let mut fake = Fake::default();
        let mut torn = false;
        match std::fs::read_to_string(path) {
            Ok(text) => {
                torn = !text.is_empty() && !text.ends_with('\n');
                for (n, line) in text.lines().enumerate() {
                    let applied = serde_json::from_str::<Value>(line)
                        .map_err(|e| e.to_string())
                        .and_then(|v| fake.replay(&v));
                    if let Err(e) = applied {
                        // A line cut short by a crash: the rest still counts.
                        tracing::warn!(line = n + 1, error = %e, "dry-run: skipping a recorded line");
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        if torn {
            // The next record starts on a line of its own.
            writeln!(file)?;
        }
        Ok(RecordingRuntime {
            file: Some(Mutex::new(file)),
            fake: Mutex::new(fake),
        })
    }

    fn fake(&self) -> std::sync::MutexGuard<'_, Fake> {
        self.fake.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records one call; fails it if a test asked for that.
    fn record(&self, call: &'static str, request: Value) -> RuntimeResult<()> {
        let line = json!({"call": call, "request": request});
        if let Some(file) = &self.file {
            let mut file = file.lock().unwrap_or_else(|e| e.into_inner());
            // A full disk must not stop the pretend runtime; say so once per call.
            if let Err(e) = writeln!(file, "{line}") {
                tracing::warn!(error = %e, "dry-run: recording {call}");
            }
        }
        let mut fake = self.fake();
        fake.calls.push(line);
        match fake.failures.remove(call) {
            Some(message) => Err(RuntimeError::Call { call, message }),
            None => Ok(()),
        }
    }

    /// Every call so far, `{"call": ..., "request": ...}`.
    pub fn calls(&self) -> Vec<Value> {
        self.fake().calls.clone()
    }

    /// The names of the calls so far, in order.
    pub fn call_names(&self) -> Vec<String> {
        self.fake()
            .calls
            .iter()
            .map(|c| c["call"].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    /// Makes the next `call` fail with `message`.
    pub fn fail_next(&self, call: &str, message: &str) {
        self.fake()
            .failures
            .insert(call.to_owned(), message.to_owned());
    }

    /// Makes `image` absent.
    pub fn remove_image(&self, image: &str) {
        self.fake().missing_images.insert(image.to_owned());
    }

    /// Makes the running container `name` of pod `uid` exit with `code`;
    /// whether there was one.
    pub fn exit_container(&self, uid: &str, name: &str, code: i32) -> bool {
        let mut fake = self.fake();
        let Fake {
            sandboxes,
            containers,
            ..
        } = &mut *fake;
        for c in containers.values_mut() {
            let in_pod = sandboxes
                .get(&c.sandbox_id)
                .is_some_and(|s| s.config.uid == uid);
            if in_pod && c.config.name == name && c.state == ContainerState::Running {
                c.state = ContainerState::Exited;
                c.finished_at = now_ns();
                c.exit_code = code;
                c.reason = if code == 0 { "Completed" } else { "Error" }.to_owned();
                return true;
            }
        }
        false
    }

    /// How many containers and sandboxes the runtime holds.
    pub fn counts(&self) -> (usize, usize) {
        let fake = self.fake();
        (fake.containers.len(), fake.sandboxes.len())
    }
}

#[tonic::async_trait]
impl ContainerRuntime for RecordingRuntime {
    async fn version(&self) -> RuntimeResult<RuntimeVersion> {
        Ok(RuntimeVersion {
            name: "tessera-dry-run".to_owned(),
            version: VERSION.to_owned(),
        })
    }

    async fn run_sandbox(&self, config: &SandboxConfig) -> RuntimeResult<String> {
        self.record("RunPodSandbox", json!({"config": config}))?;
        Ok(self.fake().run_sandbox(config.clone()))
    }

    async fn sandbox_ip(&self, id: &str) -> RuntimeResult<Option<String>> {
        match self.fake().sandboxes.get(id) {
            Some(_) => Ok(None),
            None => Err(RuntimeError::NotFound {
                call: "PodSandboxStatus",
                message: format!("sandbox {id}"),
            }),
        }
    }

    async fn stop_sandbox(&self, id: &str) -> RuntimeResult<()> {
        self.record("StopPodSandbox", json!({"pod_sandbox_id": id}))?;
        self.fake().stop_sandbox(id);
        Ok(())
    }

    async fn remove_sandbox(&self, id: &str) -> RuntimeResult<()> {
        self.record("RemovePodSandbox", json!({"pod_sandbox_id": id}))?;
        self.fake().remove_sandbox(id);
        Ok(())
    }

    async fn image_present(&self, image: &str) -> RuntimeResult<bool> {
        self.record("ImageStatus", json!({"image": {"image": image}}))?;
        Ok(!self.fake().missing_images.contains(image))
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        sandbox: &SandboxConfig,
        config: &ContainerConfig,
    ) -> RuntimeResult<String> {
        self.record(
            "CreateContainer",
            json!({"pod_sandbox_id": sandbox_id, "config": config, "sandbox_config": sandbox}),
        )?;
        self.fake().create_container(sandbox_id, config.clone())
    }

    async fn start_container(&self, id: &str) -> RuntimeResult<()> {
        self.record("StartContainer", json!({"container_id": id}))?;
        self.fake().start_container(id)
    }

    async fn stop_container(&self, id: &str, timeout: i64) -> RuntimeResult<()> {
        self.record(
            "StopContainer",
            json!({"container_id": id, "timeout": timeout}),
        )?;
        self.fake().stop_container(id);
        Ok(())
    }

    async fn remove_container(&self, id: &str) -> RuntimeResult<()> {
        self.record("RemoveContainer", json!({"container_id": id}))?;
        self.fake().containers.remove(id);
        Ok(())
    }

    async fn container_status(&self, id: &str) -> RuntimeResult<ContainerStatus> {
        let fake = self.fake();
        let c = fake
            .containers
            .get(id)
            .ok_or_else(|| RuntimeError::NotFound {
                call: "ContainerStatus",
                message: format!("container {id}"),
            })?;
        Ok(ContainerStatus {
            id: id.to_owned(),
            state: c.state,
            created_at: c.created_at,
            started_at: c.started_at,
            finished_at: c.finished_at,
            exit_code: c.exit_code,
            reason: c.reason.clone(),
            message: String::new(),
            image_ref: c.config.image.clone(),
        })
    }

    async fn list_sandboxes(&self) -> RuntimeResult<Vec<SandboxInfo>> {
        Ok(self
            .fake()
            .sandboxes
            .iter()
            .map(|(id, s)| SandboxInfo {
                id: id.clone(),
                pod_uid: s.config.uid.clone(),
                node: s
                    .config
                    .labels
                    .get(super::labels::NODE)
                    .cloned()
                    .unwrap_or_default(),
                ready: s.ready,
                attempt: s.config.attempt,
            })
            .collect())
    }

    async fn list_containers(&self) -> RuntimeResult<Vec<ContainerInfo>> {
        let fake = self.fake();
        Ok(fake
            .containers
            .iter()
            .map(|(id, c)| ContainerInfo {
                id: id.clone(),
                sandbox_id: c.sandbox_id.clone(),
                pod_uid: fake
                    .sandboxes
                    .get(&c.sandbox_id)
                    .map(|s| s.config.uid.clone())
                    .unwrap_or_default(),
                node: c
                    .config
                    .labels
                    .get(super::labels::NODE)
                    .cloned()
                    .unwrap_or_default(),
                name: c.config.name.clone(),
                attempt: c.config.attempt,
                state: c.state,
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(uid: &str) -> SandboxConfig {
        SandboxConfig {
            name: "p".to_owned(),
            namespace: "default".to_owned(),
            uid: uid.to_owned(),
            labels: [(super::super::labels::NODE.to_owned(), "n".to_owned())].into(),
            ..SandboxConfig::default()
        }
    }

    fn container(name: &str) -> ContainerConfig {
        ContainerConfig {
            name: name.to_owned(),
            image: "busybox".to_owned(),
            cdi_devices: vec!["example.com/dev=0".to_owned()],
            ..ContainerConfig::default()
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_new_runtime_on_the_same_file_still_runs_what_ran() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("cri.jsonl");
        let first = RecordingRuntime::to_file(&path).expect("file");
        let config = sandbox("uid-1");
        let sb = first.run_sandbox(&config).await.expect("sandbox");
        let keep = first
            .create_container(&sb, &config, &container("keep"))
            .await
            .expect("create");
        first.start_container(&keep).await.expect("start");
        let gone = first
            .create_container(&sb, &config, &container("gone"))
            .await
            .expect("create");
        first.start_container(&gone).await.expect("start");
        first.stop_container(&gone, 0).await.expect("stop");
        first.remove_container(&gone).await.expect("remove");
        let other = first.run_sandbox(&sandbox("uid-2")).await.expect("sandbox");
        first.stop_sandbox(&other).await.expect("stop");
        first.remove_sandbox(&other).await.expect("remove");
        drop(first);

        // A kubelet restart: the pretend containers outlive it.
        let second = RecordingRuntime::to_file(&path).expect("file");
        let sandboxes = second.list_sandboxes().await.expect("sandboxes");
        assert_eq!(sandboxes.len(), 1, "{sandboxes:?}");
        assert_eq!(sandboxes[0].id, sb);
        assert_eq!(sandboxes[0].pod_uid, "uid-1");
        assert_eq!(sandboxes[0].node, "n");
        assert!(sandboxes[0].ready);
        let containers = second.list_containers().await.expect("containers");
        assert_eq!(containers.len(), 1, "{containers:?}");
        assert_eq!(containers[0].id, keep);
        assert_eq!(containers[0].name, "keep");
        assert_eq!(containers[0].state, ContainerState::Running);
        // New ids do not collide with the replayed ones.
        let next = second
            .create_container(&sb, &config, &container("next"))
            .await
            .expect("create");
        assert!(![&sb, &keep, &gone, &other].contains(&&next), "{next}");
        // A torn line (a crash mid-write) is skipped, the rest replayed.
        drop(second);
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(b"{\"call\":\"StartCon"))
            .expect("append");
        let third = RecordingRuntime::to_file(&path).expect("file");
        assert_eq!(third.counts(), (2, 1));
        third.start_container(&next).await.expect("start");
        drop(third);
        let fourth = RecordingRuntime::to_file(&path).expect("file");
        let running = fourth.list_containers().await.expect("containers");
        assert!(
            running
                .iter()
                .any(|c| c.id == next && c.state == ContainerState::Running),
            "a record after the torn line counts: {running:?}"
        );
    }
}
