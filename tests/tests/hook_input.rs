//! `tessera-hook` run directly on hostile input: bad alloc ids (traversal,
//! NUL, 300 characters), transient specs it must not trust (writable by
//! others, a symlink, not root's, wrong content), and OCI state on stdin that is
//! truncated, huge or not JSON. Each must exit non-zero with one line on stderr
//! and change nothing — checked against a snapshot of the whole fixture, whose
//! sensitivity a positive control (a valid allocation, which the hook binds)
//! demonstrates.
//!
//! The state names a real process in a private mount namespace with the
//! bundle's rootfs bind-mounted and a procfs under it (`unshare --mount`,
//! `mount --bind`, `sleep`), started by the process that runs the hook and in
//! the host's pid namespace as the bundle's config says (no `pid` namespace):
//! a stand-in container the hook proves to be one, so a hook that wrongly
//! went ahead would act on a throwaway namespace and a scratch rootfs, never
//! on the host.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tessera_e2e::hookenv;
use tessera_e2e::hookenv::{ALLOC_ANNOTATION, ALLOC_ID, HookFixture, SCRATCH_BASE, hook_binary};
use tessera_e2e::sentinel::{changes, snapshot};
use tessera_test_support::oci::Bundle;
use tessera_test_support::require;

/// A `sleep` in its own private mount namespace where the bundle's rootfs is
/// a bind mount with a procfs under it, as runc and crun leave it: the pid the
/// states name, a stand-in container that a hook may act on without reaching
/// the host.
struct Sleeper(Child);

impl Sleeper {
    fn start(rootfs: &Path) -> Self {
        let child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(
                "mkdir -p \"$0/proc\" && mount --bind \"$0\" \"$0\" && \
                 mount -t proc proc \"$0/proc\" && exec sleep 120",
            )
            .arg(rootfs)
            .spawn()
            .expect("unshare");
        let deadline = Instant::now() + Duration::from_secs(5);
        // `sleep` runs only once the bind mount is made.
        while fs::read_to_string(format!("/proc/{}/comm", child.id()))
            .map_or(true, |c| c.trim() != "sleep")
        {
            assert!(
                Instant::now() < deadline,
                "the stand-in container did not start"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        Sleeper(child)
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Setup {
    fx: HookFixture,
    sleeper: Sleeper,
    bundle: Bundle,
}

fn setup(tag: &str) -> Option<Setup> {
    if require(&hookenv::needs(&["runc", "unshare"])).is_err() {
        return None;
    }
    let fx = HookFixture::new(tag).expect("fixture");
    let mut bundle = fx.bundle("true").expect("bundle");
    // The stand-in lives in the host's pid namespace; say so, as a hostPID
    // container's config does, or the hook rightly refuses it.
    bundle.set_namespace("pid", None);
    bundle.write().expect("config.json");
    Some(Setup {
        fx,
        sleeper: Sleeper::start(&bundle.rootfs()),
        bundle,
    })
}

/// [`setup`] with the bundle annotated with [`ALLOC_ID`], and the state
/// naming it.
fn setup_annotated(tag: &str) -> Option<(Setup, Value)> {
    let mut s = setup(tag)?;
    s.bundle.annotate(ALLOC_ANNOTATION, ALLOC_ID);
    s.bundle.write().expect("config");
    let input = state(&s, json!({ ALLOC_ANNOTATION: ALLOC_ID }));
    Some((s, input))
}

/// An OCI state as runc writes it for a created container.
fn state(s: &Setup, annotations: Value) -> Value {
    json!({
        "ociVersion": "1.0.2-dev",
        "id": "tessera-e2e-input",
        "status": "created",
        "pid": s.sleeper.pid(),
        "bundle": s.bundle.dir(),
        "annotations": annotations,
    })
}

/// Runs the hook with `args` and `stdin`; kills it after 10 s.
fn run_hook(args: &[String], stdin: Vec<u8>) -> (ExitStatus, String) {
    let mut child = Command::new(hook_binary())
        .args(&args[1..])
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("hook");
    let mut pipe = child.stdin.take().expect("stdin");
    // The hook may stop reading early (huge input): a broken pipe is fine.
    let writer = std::thread::spawn(move || {
        let _ = pipe.write_all(&stdin);
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("tessera-hook {:?} ran over 10 s", &args[1..]);
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let _ = writer.join();
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
    }
    (status, stderr)
}

/// Exit code for malformed input (the OCI state).
const EXIT_INPUT: i32 = 3;
/// Exit code for a refused request (bad id, untrusted or invalid spec).
const EXIT_REFUSED: i32 = 4;

/// The hook must refuse: exit with `code`, exactly one stderr line, and no
/// change anywhere in the fixture or next to it. Returns what went wrong.
fn refusal_problem(s: &Setup, what: &str, verb: &str, stdin: Vec<u8>, code: i32) -> Option<String> {
    let before = snapshot(s.fx.dir()).expect("snapshot");
    let scratch_before = scratch_names();
    let (status, stderr) = run_hook(&s.fx.hook_args(verb), stdin);
    let after = snapshot(s.fx.dir()).expect("snapshot");
    eprintln!("{what}: {status}: {}", stderr.trim_end());
    let mut problems = Vec::new();
    if status.success() {
        problems.push(format!("accepted it (stderr: {stderr:?})"));
    } else if status.code() != Some(code) {
        problems.push(format!("{status}, want exit code {code}"));
    }
    let lines = stderr.trim_end_matches('\n').lines().count();
    if lines != 1 {
        problems.push(format!("want one stderr line, got {stderr:?}"));
    }
    let changed = changes(&before, &after);
    if !changed.is_empty() {
        problems.push(format!("changed {changed:?}"));
    }
    let new: Vec<_> = scratch_names()
        .into_iter()
        .filter(|n| !scratch_before.contains(n) && n.contains("escape"))
        .collect();
    if !new.is_empty() {
        problems.push(format!("created {new:?} in {SCRATCH_BASE}"));
    }
    (!problems.is_empty()).then(|| format!("{what}: {}", problems.join("; ")))
}

fn assert_none(failures: &[String]) {
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

fn scratch_names() -> Vec<String> {
    fs::read_dir(SCRATCH_BASE)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Spoils the transient spec at the given path.
type Spoiler = Box<dyn Fn(&Path)>;

fn set_config_env(s: &mut Setup, entry: Option<&str>) {
    let env = &mut s.bundle.config_mut()["process"]["env"];
    let mut list: Vec<Value> = env
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|v| {
            !v.as_str()
                .unwrap_or_default()
                .starts_with("TESSERA_ALLOC_ID=")
        })
        .collect();
    if let Some(entry) = entry {
        list.push(json!(entry));
    }
    *env = json!(list);
}

#[test]
fn a_valid_allocation_binds_which_the_snapshot_sees() {
    // Positive control for the "nothing changed" checks below: the same
    // harness with a good alloc id and spec sees the hook's binding record.
    let Some((s, input)) = setup_annotated("input-control") else {
        return;
    };
    let before = snapshot(s.fx.dir()).expect("snapshot");
    let (status, stderr) = run_hook(&s.fx.hook_args("prestart"), input.to_string().into_bytes());
    assert!(status.success(), "valid allocation refused: {stderr}");
    let changed = changes(&before, &snapshot(s.fx.dir()).expect("snapshot"));
    assert!(
        changed.iter().any(|c| c.contains("state/alloc")),
        "the snapshot does not see the binding: {changed:?}"
    );
    // And poststop takes the record away again.
    let (status, stderr) = run_hook(&s.fx.hook_args("poststop"), input.to_string().into_bytes());
    assert!(status.success(), "poststop: {stderr}");
    assert!(
        s.fx.binding_records(ALLOC_ID, "tessera-e2e-input")
            .is_empty(),
        "record left after poststop"
    );
}

#[test]
fn bad_alloc_ids_are_refused_without_touching_anything() {
    let Some(mut s) = setup("input-ids") else {
        return;
    };
    let long = "a".repeat(300);
    let long_valid_chars = format!("pod-{}-0", "1".repeat(294));
    let ids: Vec<&str> = vec![
        "../escape",
        "../../escape",
        "../../../escape",
        "pod-1234-0/../../../escape",
        "pod-1234\u{0}-0",
        "pod-1234-0\u{0}",
        &long,
        &long_valid_chars,
        "",
        ".",
        "..",
        "/etc/passwd",
        "POD-1234-0",
        "pod_1234-0",
        "pod 1234-0",
        "pod-1234-0\n",
    ];
    // Put specs where a traversing or truncating reader would find them, so a
    // refusal is the id check's doing, not a missing file's.
    let cdi = s.fx.cdi_dir.clone();
    for id in ["escape", "pod-1234"] {
        let spec = s.fx.transient_spec(id).expect("spec");
        fs::write(
            cdi.join(format!("tessera.io-alloc_{id}.json")),
            serde_json::to_vec(&spec).expect("json"),
        )
        .expect("decoy spec");
    }
    let mut failures = Vec::new();
    for id in &ids {
        // From the annotation…
        set_config_env(&mut s, None);
        s.bundle.annotate(ALLOC_ANNOTATION, id);
        s.bundle.write().expect("config");
        let input = state(&s, json!({ ALLOC_ANNOTATION: id }));
        failures.extend(refusal_problem(
            &s,
            &format!("annotation {id:?}"),
            "prestart",
            input.to_string().into_bytes(),
            EXIT_REFUSED,
        ));
        failures.extend(refusal_problem(
            &s,
            &format!("poststop, annotation {id:?}"),
            "poststop",
            input.to_string().into_bytes(),
            EXIT_REFUSED,
        ));
        // …and from the container's env.
        if let Some(a) = s.bundle.config_mut()["annotations"].as_object_mut() {
            a.remove(ALLOC_ANNOTATION);
        }
        set_config_env(&mut s, Some(&format!("TESSERA_ALLOC_ID={id}")));
        s.bundle.write().expect("config");
        failures.extend(refusal_problem(
            &s,
            &format!("TESSERA_ALLOC_ID={id:?}"),
            "prestart",
            state(&s, json!({})).to_string().into_bytes(),
            EXIT_REFUSED,
        ));
    }
    assert_none(&failures);
}

#[test]
fn untrusted_transient_specs_are_refused() {
    let Some((s, input)) = setup_annotated("input-spec") else {
        return;
    };
    let input = input.to_string().into_bytes();
    let path = s.fx.transient_spec_path(ALLOC_ID);
    let good = fs::read(&path).expect("spec");
    let cdi = s.fx.cdi_dir.clone();
    let restore = |p: &Path| {
        let _ = fs::remove_file(p);
        fs::write(p, &good).expect("restore");
        fs::set_permissions(p, fs::Permissions::from_mode(0o644)).expect("mode");
        fs::set_permissions(&cdi, fs::Permissions::from_mode(0o755)).expect("dir mode");
    };

    let mode = |m: u32| {
        move |p: &Path| fs::set_permissions(p, fs::Permissions::from_mode(m)).expect("chmod")
    };
    let cases: Vec<(&str, Spoiler)> = vec![
        ("world-writable spec (0666)", Box::new(mode(0o666))),
        ("world-writable spec (0646)", Box::new(mode(0o646))),
        ("group-writable spec (0664)", Box::new(mode(0o664))),
        (
            "spec owned by nobody",
            Box::new(|p: &Path| {
                std::os::unix::fs::chown(p, Some(65534), Some(65534)).expect("chown")
            }),
        ),
        (
            "spec is a symlink to a good spec",
            Box::new(|p: &Path| {
                let real: PathBuf = p.with_extension("real");
                fs::rename(p, &real).expect("rename");
                symlink(&real, p).expect("symlink");
            }),
        ),
        (
            "world-writable CDI dir",
            Box::new(|p: &Path| {
                fs::set_permissions(p.parent().expect("dir"), fs::Permissions::from_mode(0o777))
                    .expect("chmod dir")
            }),
        ),
        (
            "group-writable CDI dir",
            Box::new(|p: &Path| {
                fs::set_permissions(p.parent().expect("dir"), fs::Permissions::from_mode(0o775))
                    .expect("chmod dir")
            }),
        ),
        (
            "spec missing",
            Box::new(|p: &Path| fs::remove_file(p).expect("rm")),
        ),
        (
            "spec is not JSON",
            Box::new(|p: &Path| fs::write(p, b"not json {").expect("write")),
        ),
        (
            "spec of the wrong kind",
            Box::new(|p: &Path| {
                let mut v: Value =
                    serde_json::from_slice(&fs::read(p).expect("read")).expect("json");
                v["kind"] = json!("tessera.io/gpu");
                fs::write(p, v.to_string()).expect("write");
            }),
        ),
        (
            "spec names another device",
            Box::new(|p: &Path| {
                let mut v: Value =
                    serde_json::from_slice(&fs::read(p).expect("read")).expect("json");
                v["devices"][0]["name"] = json!("pod-9999-0");
                fs::write(p, v.to_string()).expect("write");
            }),
        ),
    ];
    let mut failures = Vec::new();
    for (what, spoil) in cases {
        restore(&path);
        let _ = fs::remove_file(path.with_extension("real"));
        spoil(&path);
        failures.extend(refusal_problem(
            &s,
            what,
            "prestart",
            input.clone(),
            EXIT_REFUSED,
        ));
    }
    restore(&path);
    assert_none(&failures);
}

#[test]
fn bad_state_on_stdin_is_refused_with_one_line() {
    let Some((s, mut huge)) = setup_annotated("input-stdin") else {
        return;
    };
    let good = huge.to_string();
    huge["annotations"]["padding"] = json!("x".repeat(1 << 20));
    let inputs: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        ("truncated", good.as_bytes()[..good.len() / 2].to_vec()),
        (
            "truncated by one byte",
            good.as_bytes()[..good.len() - 1].to_vec(),
        ),
        ("not JSON", b"this is not an OCI state\n".to_vec()),
        ("binary", (0..=255u8).cycle().take(4096).collect()),
        ("a JSON array", b"[]".to_vec()),
        (
            "wrong types",
            json!({"ociVersion": 1, "id": [], "pid": "x", "bundle": 7})
                .to_string()
                .into_bytes(),
        ),
        ("1 MiB", huge.to_string().into_bytes()),
        ("1 MiB of spaces", {
            let mut v = good.clone().into_bytes();
            v.extend(std::iter::repeat_n(b' ', 1 << 20));
            v
        }),
    ];
    let mut failures = Vec::new();
    for (what, input) in inputs {
        for verb in ["prestart", "poststop"] {
            failures.extend(refusal_problem(
                &s,
                &format!("{verb}, stdin {what}"),
                verb,
                input.clone(),
                EXIT_INPUT,
            ));
        }
    }
    // Usage errors exit 2 and name the problem first (the usage text may follow).
    for args in [
        vec![],
        vec!["start".to_owned()],
        vec!["prestart".to_owned(), "--config".to_owned()],
    ] {
        let mut argv = vec!["tessera-hook".to_owned()];
        argv.extend(args.clone());
        let (status, stderr) = run_hook(&argv, good.clone().into_bytes());
        if status.code() != Some(2) || !stderr.starts_with("tessera-hook: ") {
            failures.push(format!("argv {args:?}: {status}, stderr {stderr:?}"));
        }
    }
    assert_none(&failures);
}
