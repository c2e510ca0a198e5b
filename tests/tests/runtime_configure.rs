//! `tessera-cdi runtime configure --runtime containerd` against a live
//! containerd 1.7: a private daemon (own root, state, socket and CNI
//! directories under a scratch directory) runs containerd 1.7's real default
//! config (`cdi-gen/tests/fixtures/containerd-1.7-default.toml`, only those
//! paths changed); its CRI plugin reports CDI off. After `configure` and a
//! restart, the daemon's CRI plugin reports `EnableCDI:true` with both spec
//! directories, and a second `configure` changes nothing.
//!
//! The daemon's view is read from the line its CRI plugin logs at start
//! ("Start cri plugin with config {...}"): what the running daemon took from
//! the file, not what the file says.

// Helpers of this test report failures by panicking, like the test itself.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tessera_test_support::containerd::bin_dir;
use tessera_test_support::rootfs::scratch_dir;
use tessera_test_support::{Need, artefact, require, workspace_root};

/// A private containerd; SIGTERM (then SIGKILL) on drop.
struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Daemon {
    /// Starts containerd with `config` and waits until its CRI plugin has
    /// logged its config and the daemon serves.
    fn start(config: &Path, base: &Path) -> Daemon {
        let log = base.join("containerd.log");
        let out = fs::File::create(&log).unwrap();
        let err = out.try_clone().unwrap();
        let tmp = base.join("tmp");
        fs::create_dir_all(&tmp).unwrap();
        let child = std::os::unix::process::CommandExt::process_group(
            Command::new(bin_dir().join("containerd"))
                .arg("--config")
                .arg(config)
                .env_clear()
                .env(
                    "PATH",
                    format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", bin_dir().display()),
                )
                .env("TMPDIR", &tmp)
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err),
            0,
        )
        .spawn()
        .unwrap();
        let mut daemon = Daemon { child, log };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let text = fs::read_to_string(&daemon.log).unwrap_or_default();
            if text.contains("containerd successfully booted") && text.contains("Start cri plugin")
            {
                return daemon;
            }
            if let Ok(Some(status)) = daemon.child.try_wait() {
                panic!("containerd exited with {status} while starting:\n{text}");
            }
            assert!(
                Instant::now() < deadline,
                "containerd did not boot within 30 s:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `(EnableCDI, CDISpecDirs)` from the CRI plugin's start line.
    fn cri_cdi(&self) -> (String, String) {
        let text = fs::read_to_string(&self.log).unwrap();
        let line = text
            .lines()
            .find(|l| l.contains("Start cri plugin with config"))
            .expect("the CRI plugin's start line");
        let field = |name: &str, end: char| {
            let start = line
                .find(name)
                .unwrap_or_else(|| panic!("{name} not in {line}"))
                + name.len();
            let rest = &line[start..];
            rest[..rest.find(end).unwrap_or(rest.len())].to_owned()
        };
        (field("EnableCDI:", ' '), field("CDISpecDirs:[", ']'))
    }

    fn stop(mut self) {
        self.shut_down();
    }

    fn shut_down(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            if let Ok(pid) = i32::try_from(self.child.id()) {
                let _ = Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status();
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// containerd 1.7's default config with every path it would write below `base`.
fn private_default_config(base: &Path) -> String {
    let fixture = workspace_root().join("cdi-gen/tests/fixtures/containerd-1.7-default.toml");
    let mut text = fs::read_to_string(&fixture).unwrap();
    let b = base.display();
    for (from, to) in [
        (
            "root = \"/var/lib/containerd\"",
            format!("root = \"{b}/root\""),
        ),
        (
            "state = \"/run/containerd\"",
            format!("state = \"{b}/state\""),
        ),
        (
            "address = \"/run/containerd/containerd.sock\"",
            format!("address = \"{b}/containerd.sock\""),
        ),
        ("path = \"/opt/containerd\"", format!("path = \"{b}/opt\"")),
        (
            "bin_dir = \"/usr/lib/cni\"",
            format!("bin_dir = \"{b}/cni/bin\""),
        ),
        (
            "conf_dir = \"/etc/cni/net.d\"",
            format!("conf_dir = \"{b}/cni/net.d\""),
        ),
    ] {
        assert_eq!(
            text.matches(from).count(),
            1,
            "{from} in {}",
            fixture.display()
        );
        text = text.replace(from, &to);
    }
    text
}

fn configure(config: &Path) -> (Option<i32>, String, String) {
    let out = Command::new(artefact("tessera-cdi"))
        .args([
            "runtime",
            "configure",
            "--runtime",
            "containerd",
            "--config",
        ])
        .arg(config)
        .arg("--runtime-binary")
        .arg(bin_dir().join("containerd"))
        .env_remove("TESSERA_LOG")
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn configure_turns_cdi_on_in_a_live_containerd_17_and_is_idempotent() {
    let Ok(()) = require(&[
        Need::Root,
        Need::Built("tessera-cdi"),
        Need::File {
            path: bin_dir().join("containerd"),
            fix: "containerd 1.7: run scripts/lib.sh's tessera_install_containerd, \
                  or set TESSERA_CONTAINERD_BIN_DIR"
                .to_owned(),
        },
    ]) else {
        return;
    };
    let scratch = scratch_dir("runtime-configure").unwrap();
    let base = scratch.path();
    let config = base.join("config.toml");
    fs::write(&config, private_default_config(base)).unwrap();

    let daemon = Daemon::start(&config, base);
    let (enabled, dirs) = daemon.cri_cdi();
    daemon.stop();
    assert_eq!(enabled, "false", "the default config has CDI off");
    assert_eq!(dirs, "/etc/cdi /var/run/cdi");

    let before = fs::read_to_string(&config).unwrap();
    let started = Instant::now();
    let (code, stdout, stderr) = configure(&config);
    eprintln!("configure took {:?}", started.elapsed());
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("containerd 1.7."), "{stdout}");
    assert!(stdout.contains("CDI enabled in"), "{stdout}");
    assert!(stdout.contains("systemctl restart containerd"), "{stdout}");
    let after = fs::read_to_string(&config).unwrap();
    assert_eq!(
        before.replace("enable_cdi = false", "enable_cdi = true"),
        after,
        "only enable_cdi may change"
    );

    let daemon = Daemon::start(&config, base);
    let (enabled, dirs) = daemon.cri_cdi();
    daemon.stop();
    assert_eq!(enabled, "true", "the restarted daemon must have CDI on");
    assert_eq!(dirs, "/etc/cdi /var/run/cdi");

    let (code, stdout, stderr) = configure(&config);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("already configured"), "{stdout}");
    assert_eq!(fs::read_to_string(&config).unwrap(), after);
}
