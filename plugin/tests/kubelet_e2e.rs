//! `tessera-device-plugin` as a process against the kubelet stand-in
//! (`tessera-sim kubelet`, dry-run runtime) and the stand-in API server, on a
//! simulated GPU node (`dynamic`: an H100 shared, an A100 with MIG on):
//!
//! - it registers, and the Node's capacity shows `nvidia.com/gpu` = split
//!   count × share GPUs + the A100's seven MIG units;
//! - the kubelet restarted (it wipes `device-plugins/`) → the plugin serves
//!   and registers again within seconds;
//! - an XID injected into the simulated node (`tessera-sim inject-xid`) and a
//!   lost GPU (`tessera-sim lose-gpu`) reach ListAndWatch within 2 s (the
//!   latency is printed);
//! - SIGTERM: exit 0, our socket removed;
//! - a bad flag: exit 2 and one line naming it.
//!
//! Needs root (the node's device nodes) and `tessera-sim` built
//! (`cargo build -p tessera-sim --bin tessera-sim`; the NVML stand-in too).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use tessera_plugin::api::deviceplugin::v1beta1 as dp;
use tessera_plugin::server;
use tessera_test_support::kube::StandInApiServer;
use tessera_test_support::node::SimNode;
use tessera_test_support::{Need, artefact, require};

const PLUGIN: &str = env!("CARGO_BIN_EXE_tessera-device-plugin");
const NODE: &str = "plugin-node";
const SPLIT: u32 = 4;
/// An A100-40GB holds seven 1g.5gb instances, its smallest profile.
const A100_UNITS: u32 = 7;

/// A child process with its log; SIGTERM (then SIGKILL) on drop.
struct Proc {
    child: Option<Child>,
    log: PathBuf,
}

impl Proc {
    fn spawn(cmd: &mut Command, log: PathBuf) -> Result<Proc> {
        let file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .with_context(|| format!("spawning {cmd:?}"))?;
        Ok(Proc {
            child: Some(child),
            log,
        })
    }

    fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    fn stop(&mut self) {
        if let Some(child) = self.child.take() {
            tessera_test_support::terminate(child, Duration::from_secs(10));
        }
    }

    fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// API server, node, kubelet, plugin.
struct Env {
    rt: tokio::runtime::Runtime,
    api: StandInApiServer,
    node: SimNode,
    kubelet_args: Vec<String>,
    kubelet: Proc,
    plugin: Proc,
    client: kube::Client,
}

fn needs() -> Vec<Need> {
    let mut needs = SimNode::profile("dynamic").needs();
    needs.extend(tessera_test_support::kube::needs());
    needs.push(Need::Built("tessera-sim"));
    needs
}

impl Env {
    fn start() -> Result<Env> {
        let api = StandInApiServer::start(&[])?;
        let node = match SimNode::profile("dynamic").build() {
            Ok(node) => node,
            Err(skip) => bail!("building the simulated node: {skip:?}"),
        };
        let state = node.state_at_build();
        ensure!(
            state.gpus.len() == 2
                && !state.gpus[0].mig_enabled
                && state.gpus[1].mig_enabled
                && state.gpus[1].model.contains("A100-40GB"),
            "the dynamic profile changed: {:?}",
            state.gpus
        );
        let root = node.root().display().to_string();
        let kubelet_args = vec![
            "kubelet".to_owned(),
            "--node".to_owned(),
            NODE.to_owned(),
            "--root".to_owned(),
            root.clone(),
            "--kubeconfig".to_owned(),
            api.kubeconfig().display().to_string(),
            "--dry-run".to_owned(),
            node.dir().join("cri.jsonl").display().to_string(),
        ];
        let kubelet = Proc::spawn(
            Command::new(artefact("tessera-sim"))
                .args(&kubelet_args)
                .env("TESSERA_LOG", "info"),
            node.dir().join("kubelet.log"),
        )?;
        let kubelet_sock = Path::new(&root).join("var/lib/kubelet/device-plugins/kubelet.sock");
        wait_until("kubelet.sock", Duration::from_secs(20), || {
            Ok(kubelet_sock.exists())
        })?;
        let config = node.dir().join("cluster.yaml");
        fs::write(&config, "# built-in defaults\n")?;
        let plugin = Proc::spawn(
            Command::new(PLUGIN)
                .args(["--node-name", NODE, "--kubeconfig"])
                .arg(api.kubeconfig())
                .arg("--driver-root")
                .arg(node.root())
                .arg("--kubelet-dir")
                .arg(node.root().join("var/lib/kubelet"))
                .arg("--cdi-dir")
                .arg(node.dir().join("cdi"))
                .arg("--state-dir")
                .arg(node.dir().join("state"))
                .arg("--config")
                .arg(&config)
                .args(["--metrics-listen", "off"])
                .args(["--device-split-count", &SPLIT.to_string()])
                .env("TESSERA_LOG", "info")
                .env_remove("NODE_NAME"),
            node.dir().join("plugin.log"),
        )?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        let client = rt.block_on(tessera_test_support::kube::client(api.kubeconfig()))?;
        Ok(Env {
            rt,
            api,
            node,
            kubelet_args,
            kubelet,
            plugin,
            client,
        })
    }

    fn kubelet_dir(&self) -> PathBuf {
        self.node.root().join("var/lib/kubelet/device-plugins")
    }

    fn socket(&self) -> PathBuf {
        self.kubelet_dir().join("tessera-gpu.sock")
    }

    fn logs(&self) -> String {
        format!(
            "--- plugin log ---\n{}\n--- kubelet log ---\n{}\n--- apiserver log ---\n{}",
            self.plugin.log_text(),
            self.kubelet.log_text(),
            self.api.log_text()
        )
    }

    /// `nvidia.com/gpu` in the Node's capacity.
    fn capacity(&self) -> Option<String> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node = self.rt.block_on(nodes.get_opt(NODE)).ok()??;
        Some(node.status?.capacity?.get("nvidia.com/gpu")?.0.clone())
    }

    fn sim(&self, args: &[&str]) -> Result<()> {
        tessera_test_support::run(
            Command::new(artefact("tessera-sim"))
                .args(args)
                .arg("--root")
                .arg(self.node.root()),
        )?;
        Ok(())
    }

    fn check(&mut self, what: &str, result: Result<()>) {
        if let Err(e) = result {
            panic!("{what}: {e:#}\n{}", self.logs());
        }
        assert!(
            self.plugin.running(),
            "the plugin exited ({what})\n{}",
            self.logs()
        );
    }
}

fn wait_until(what: &str, within: Duration, mut ok: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + within;
    while !ok()? {
        if Instant::now() > deadline {
            bail!("not {what} within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

#[test]
fn registers_and_registers_again_after_a_kubelet_restart() {
    let Ok(()) = require(&needs()) else { return };
    let mut env = Env::start().expect("environment");
    let want = (SPLIT + A100_UNITS).to_string();
    let r = wait_until(
        "nvidia.com/gpu on the Node",
        Duration::from_secs(30),
        || Ok(env.capacity().as_deref() == Some(want.as_str())),
    );
    env.check("capacity after registration", r);
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &fs::metadata(env.socket())
            .expect("our socket")
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);

    // The kubelet restarts and wipes the directory.
    env.kubelet.stop();
    let kubelet_sock = env.kubelet_dir().join("kubelet.sock");
    let args = env.kubelet_args.clone();
    let log = env.node.dir().join("kubelet.log");
    env.kubelet = Proc::spawn(
        Command::new(artefact("tessera-sim"))
            .args(&args)
            .env("TESSERA_LOG", "info"),
        log,
    )
    .expect("kubelet again");
    let socket = env.socket();
    let r = wait_until("kubelet.sock again", Duration::from_secs(20), || {
        Ok(kubelet_sock.exists() && !socket.exists())
    })
    .or_else(|_| {
        // A wipe between our polls can go unseen by the test: then the
        // socket is already the new one.
        Ok(())
    });
    env.check("kubelet back", r);
    let back = Instant::now();
    let registered = "registered with kubelet";
    let before = env.plugin.log_text().matches(registered).count();
    let r = wait_until("registered again", Duration::from_secs(5), || {
        Ok(socket.exists() && env.plugin.log_text().matches(registered).count() > before)
    });
    env.check("re-registration", r);
    println!(
        "re-registered {:?} after the restarted kubelet listened",
        back.elapsed()
    );
    let r = wait_until(
        "nvidia.com/gpu on the Node again",
        Duration::from_secs(30),
        || Ok(env.capacity().as_deref() == Some(want.as_str())),
    );
    env.check("capacity after the kubelet restart", r);

    // SIGTERM: exit 0, our socket gone.
    let child = env.plugin.child.take().expect("plugin");
    let pid = rustix::process::Pid::from_child(&child);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
    let out = child.wait_with_output().expect("plugin exits");
    assert!(out.status.success(), "{}\n{}", out.status, env.logs());
    assert!(!socket.exists(), "our socket is removed at exit");
}

/// Reads lists until `want` holds for one; how long it took.
fn wait_list(
    rt: &tokio::runtime::Runtime,
    stream: &mut tonic::Streaming<dp::ListAndWatchResponse>,
    within: Duration,
    want: impl Fn(&[dp::Device]) -> bool,
) -> Result<Duration> {
    let start = Instant::now();
    rt.block_on(async {
        loop {
            let left = within.saturating_sub(start.elapsed());
            let next = tokio::time::timeout(left, stream.message())
                .await
                .context("timed out")??
                .context("ListAndWatch ended")?;
            if want(&next.devices) {
                return Ok(start.elapsed());
            }
        }
    })
}

fn all(devices: &[dp::Device], uuid: &str, health: &str) -> bool {
    let of: Vec<&dp::Device> = devices
        .iter()
        .filter(|d| d.id.starts_with(&format!("{uuid}::")))
        .collect();
    !of.is_empty() && of.iter().all(|d| d.health == health)
}

#[test]
fn an_injected_xid_and_a_lost_gpu_reach_list_and_watch_within_2s() {
    let Ok(()) = require(&needs()) else { return };
    let mut env = Env::start().expect("environment");
    let socket = env.socket();
    let r = wait_until(
        "our socket",
        Duration::from_secs(20),
        || Ok(socket.exists()),
    );
    env.check("serving", r);
    let (h100, a100) = {
        let s = env.node.state_at_build();
        (s.gpus[0].uuid.clone(), s.gpus[1].uuid.clone())
    };
    let mut stream = env
        .rt
        .block_on(async {
            let channel = server::unix_channel(&socket).await?;
            anyhow::Ok(
                dp::device_plugin_client::DevicePluginClient::new(channel)
                    .list_and_watch(dp::Empty {})
                    .await?
                    .into_inner(),
            )
        })
        .expect("ListAndWatch");
    let r = wait_list(&env.rt, &mut stream, Duration::from_secs(5), |d| {
        d.len() == (SPLIT + A100_UNITS) as usize && d.iter().all(|d| d.health == "Healthy")
    })
    .map(|_| ());
    env.check("the first list", r);

    // An application XID: nothing; a critical one in a MIG instance: the A100.
    let started = Instant::now();
    let r = env.sim(&["inject-xid", "--gpu", "0", "--xid", "13"]);
    env.check("inject-xid 13", r);
    let r = env.sim(&["inject-xid", "--gpu", "1", "--xid", "79"]);
    env.check("inject-xid 79", r);
    let r = wait_list(&env.rt, &mut stream, Duration::from_secs(2), |d| {
        all(d, &a100, "Unhealthy")
    });
    let took = r.as_ref().ok().copied();
    env.check("XID 79 → Unhealthy within 2 s", r.map(|_| ()));
    println!(
        "XID 79 → ListAndWatch Unhealthy in {took:?} after the injection ({:?} with the two tessera-sim runs)",
        started.elapsed()
    );

    // A lost GPU, then restored.
    let started = Instant::now();
    let r = env.sim(&["lose-gpu", "--gpu", "0"]);
    env.check("lose-gpu", r);
    let r = wait_list(&env.rt, &mut stream, Duration::from_secs(2), |d| {
        all(d, &h100, "Unhealthy") && all(d, &a100, "Unhealthy")
    });
    env.check("lost GPU → Unhealthy within 2 s", r.map(|_| ()));
    println!(
        "lost GPU → ListAndWatch Unhealthy in {:?}",
        started.elapsed()
    );
    let started = Instant::now();
    let r = env.sim(&["lose-gpu", "--gpu", "0", "--restore"]);
    env.check("lose-gpu --restore", r);
    let r = wait_list(&env.rt, &mut stream, Duration::from_secs(3), |d| {
        all(d, &h100, "Healthy") && all(d, &a100, "Unhealthy")
    });
    env.check("restored GPU → Healthy", r.map(|_| ()));
    println!(
        "restored GPU → ListAndWatch Healthy in {:?}",
        started.elapsed()
    );
}

#[test]
fn a_bad_flag_exits_2_with_one_line() {
    let cases: &[(&[&str], &str)] = &[
        (&["--device-split-count", "many"], "--device-split-count"),
        (&["--cdi-mode", "magic"], "--cdi-mode"),
        (&["--no-such-flag"], "--no-such-flag"),
        (
            &["--node-name", "n", "--device-memory-scaling", "0"],
            "--device-memory-scaling",
        ),
        (
            &["--node-name", "n", "--config", "/nonexistent/cluster.yaml"],
            "--config",
        ),
        (&["--config", "/dev/null"], "--node-name"),
    ];
    for (args, names) in cases {
        let out = Command::new(PLUGIN)
            .args(*args)
            .env_remove("NODE_NAME")
            .output()
            .expect("run the plugin");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: one line: {stderr}");
        assert!(
            stderr.starts_with("tessera-device-plugin: ") && stderr.contains(names),
            "{args:?}: names {names}: {stderr}"
        );
    }
}

#[test]
fn without_nvml_it_exits_1_or_blocks_as_fail_on_init_error_says() {
    let empty = tempfile::tempdir().expect("tempdir");
    let base = |fail: &str| {
        let mut cmd = Command::new(PLUGIN);
        cmd.args([
            "--node-name",
            "n",
            "--config",
            "/dev/null",
            "--metrics-listen",
            "off",
        ])
        .arg("--driver-root")
        .arg(empty.path())
        .arg(format!("--fail-on-init-error={fail}"))
        .env_remove("NODE_NAME");
        cmd
    };
    let out = base("true").output().expect("run the plugin");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.starts_with("tessera-device-plugin: "), "{stderr}");

    let mut child = base("false")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the plugin");
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        child.try_wait().expect("try_wait").is_none(),
        "--fail-on-init-error=false blocks instead of exiting"
    );
    let pid = rustix::process::Pid::from_child(&child);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
    let out = child.wait_with_output().expect("plugin exits");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}: {stderr}", out.status);
    assert!(stderr.contains("fail-on-init-error=false"), "{stderr}");
}
