//! `tessera-hook` against hostile root filesystems (CVE-2024-0132 and kin),
//! under runc and crun, with the hook at `prestart` and at `createContainer`.
//!
//! Each case points a path the hook works on (`/dev`, `/usr/local/tessera`,
//! `/etc`, `/etc/ld.so.preload`) at a sentinel tree on the host, or at `/`, and
//! asserts that after the container's life the host is as it was and the
//! container read nothing of the sentinel. runc and crun themselves follow a
//! rootfs `/dev` symlink (they create their `/dev/stdin`-style links and device
//! nodes there), so every case is run twice: once with a static no-op hook in
//! the hook's place, once with `tessera-hook`; the hook is blamed only for what
//! the second run changes beyond the first.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use tessera_e2e::hookenv::{ALLOC_ANNOTATION, ALLOC_ID, HookFixture, static_noop};
use tessera_e2e::oci::{Bundle, HookEntry, Runtime, run_bundle};
use tessera_e2e::prerequisites;
use tessera_e2e::sentinel::{HostRootView, TOKEN, changes, mounts_under, plant, snapshot};

const STAGES: [&str; 2] = ["prestart", "createContainer"];

/// What the container looks for: any file under the paths the hook touches
/// holding the sentinel's token.
const SCRIPT: &str = "find /dev/ /etc/ /usr/ /var/ -xdev -type f 2>/dev/null | xargs grep -H tessera-sentinel 2>/dev/null; echo DONE";

/// Where a hostile symlink points.
#[derive(Debug, Clone, Copy)]
enum Target {
    /// The sentinel directory, by absolute host path.
    Sentinel,
    /// The sentinel directory through `../` past the rootfs.
    SentinelRelative,
    /// A file in the sentinel that exists.
    SentinelFile(&'static str),
    /// A path in the sentinel that does not exist yet.
    SentinelNewFile(&'static str),
    /// The host's root directory.
    HostRoot,
}

#[derive(Debug, Clone, Copy)]
struct Case {
    /// Path in the rootfs that is the symlink.
    link: &'static str,
    target: Target,
}

const SENTINEL_CASES: [Case; 9] = [
    Case {
        link: "dev",
        target: Target::Sentinel,
    },
    Case {
        link: "usr/local/tessera",
        target: Target::Sentinel,
    },
    Case {
        link: "usr/local/tessera",
        target: Target::SentinelRelative,
    },
    Case {
        link: "usr/local",
        target: Target::Sentinel,
    },
    Case {
        link: "etc",
        target: Target::Sentinel,
    },
    Case {
        link: "etc",
        target: Target::SentinelRelative,
    },
    Case {
        link: "etc/ld.so.preload",
        target: Target::SentinelFile("ld.so.preload"),
    },
    Case {
        link: "etc/ld.so.preload",
        target: Target::SentinelNewFile("created-through-symlink"),
    },
    Case {
        link: "usr/local/tessera/vgpu.json",
        target: Target::SentinelFile("vgpu.json"),
    },
];

const HOST_ROOT_CASES: [Case; 3] = [
    Case {
        link: "dev",
        target: Target::HostRoot,
    },
    Case {
        link: "usr/local/tessera",
        target: Target::HostRoot,
    },
    Case {
        link: "etc",
        target: Target::HostRoot,
    },
];

fn fixture(tag: &str) -> Option<HookFixture> {
    if let Some(why) = prerequisites(&["runc", "crun", "cc"]) {
        eprintln!("SKIPPED: tessera-hook hostile-rootfs test: {why}");
        return None;
    }
    Some(HookFixture::new(tag).expect("hook fixture"))
}

fn next_n() -> u64 {
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// Makes `rootfs/<link>` a symlink to the case's target.
fn make_hostile(rootfs: &Path, case: Case, sentinel: &Path) {
    let link = rootfs.join(case.link);
    fs::create_dir_all(link.parent().expect("parent")).expect("parents");
    let _ = fs::remove_dir_all(&link);
    let _ = fs::remove_file(&link);
    let target: PathBuf = match case.target {
        Target::Sentinel => sentinel.to_owned(),
        Target::SentinelRelative => {
            let depth = link
                .parent()
                .expect("parent")
                .components()
                .count()
                .saturating_sub(1);
            let mut rel = PathBuf::new();
            for _ in 0..depth + 3 {
                rel.push("..");
            }
            rel.join(sentinel.strip_prefix("/").expect("absolute sentinel"))
        }
        Target::SentinelFile(name) | Target::SentinelNewFile(name) => sentinel.join(name),
        Target::HostRoot => PathBuf::from("/"),
    };
    symlink(&target, &link).expect("hostile symlink");
}

/// One run of a case.
struct CaseRun {
    /// Sentinel changes, by path relative to the sentinel.
    sentinel: BTreeSet<String>,
    /// Host root changes (only for `/` cases).
    host_root: BTreeSet<String>,
    /// Host mounts left under the sentinel.
    mounts: Vec<String>,
    /// Whether the hooks stage was reached at all.
    reached: bool,
    /// The container saw sentinel content.
    leaked: Option<String>,
    create_error: Option<String>,
}

fn hooks_for(fx: &HookFixture, bundle: &mut Bundle, stage: &str, marker: &Path, with_hook: bool) {
    let noop = static_noop().expect("static no-op");
    let reached = HookEntry {
        path: noop.clone(),
        args: vec!["noop".into(), marker.display().to_string()],
        env: Some(vec![]),
    };
    let plain = HookEntry {
        path: noop,
        args: vec!["noop".into()],
        env: Some(vec![]),
    };
    bundle.annotate(ALLOC_ANNOTATION, ALLOC_ID);
    bundle.hook(stage, &reached);
    if with_hook {
        bundle
            .hook(stage, &fx.hook_entry("prestart"))
            .hook("poststop", &fx.hook_entry("poststop"));
    } else {
        bundle.hook(stage, &plain).hook("poststop", &plain);
    }
}

fn run_case(
    fx: &HookFixture,
    runtime: Runtime,
    stage: &str,
    case: Case,
    with_hook: bool,
) -> CaseRun {
    let n = next_n();
    let sentinel = fx.dir().join(format!("sentinel-{n}"));
    plant(&sentinel).expect("sentinel");
    let mut bundle = fx.bundle(SCRIPT).expect("bundle");
    make_hostile(&bundle.rootfs(), case, &sentinel);
    let marker = fx.dir().join(format!("reached-{n}"));
    hooks_for(fx, &mut bundle, stage, &marker, with_hook);

    let host_before = matches!(case.target, Target::HostRoot)
        .then(|| HostRootView::read().expect("host root view"));
    let before = snapshot(&sentinel).expect("snapshot");
    let outcome = run_bundle(runtime, &bundle, "hostile").expect("run");
    let after = snapshot(&sentinel).expect("snapshot");

    let mounts = mounts_under(&sentinel).expect("mountinfo");
    for m in &mounts {
        let _ = std::process::Command::new("umount")
            .args(["-l", m])
            .status();
    }
    let host_root = match &host_before {
        Some(b) => {
            let c = HostRootView::read()
                .expect("host root view")
                .changes_since(b);
            let removed = HostRootView::clean_up_after(b);
            if !removed.is_empty() {
                eprintln!("cleaned host / after {runtime} {stage} {case:?}: {removed:?}");
            }
            c
        }
        None => BTreeSet::new(),
    };
    let leaked = outcome
        .output
        .lines()
        .find(|l| l.contains(TOKEN))
        .map(str::to_owned);
    CaseRun {
        sentinel: changes(&before, &after),
        host_root,
        mounts,
        reached: marker.exists(),
        leaked,
        create_error: outcome.create_error,
    }
}

/// Runs every case under both runtimes and stages, baseline then hook, and
/// returns what the hook did beyond the runtime.
fn check_cases(fx: &HookFixture, cases: &[Case]) -> (Vec<String>, Vec<String>) {
    let mut failures = Vec::new();
    let mut notes = Vec::new();
    for case in cases {
        for runtime in Runtime::ALL {
            for stage in STAGES {
                let what = format!(
                    "{runtime}, {stage}, rootfs {} -> {:?}",
                    case.link, case.target
                );
                let base = run_case(fx, runtime, stage, *case, false);
                let hooked = run_case(fx, runtime, stage, *case, true);
                let extra: Vec<_> = hooked.sentinel.difference(&base.sentinel).collect();
                if !extra.is_empty() {
                    failures.push(format!(
                        "{what}: the hook changed the host sentinel: {extra:?}"
                    ));
                }
                let extra_root: Vec<_> = hooked.host_root.difference(&base.host_root).collect();
                if !extra_root.is_empty() {
                    failures.push(format!(
                        "{what}: the hook changed the host's /: {extra_root:?}"
                    ));
                }
                if !hooked.mounts.is_empty() {
                    failures.push(format!(
                        "{what}: host mounts under the sentinel: {:?}",
                        hooked.mounts
                    ));
                }
                if let Some(line) = &hooked.leaked {
                    failures.push(format!("{what}: the container read the sentinel: {line}"));
                }
                notes.push(format!(
                    "{what}: runtime alone changed {} sentinel entries{}; hook {}: {}",
                    base.sentinel.len(),
                    if base.reached {
                        ""
                    } else {
                        " (hooks never reached)"
                    },
                    if hooked.reached {
                        "reached"
                    } else {
                        "never reached"
                    },
                    match &hooked.create_error {
                        None => "container ran".to_owned(),
                        Some(e) => format!("refused: {}", e.lines().last().unwrap_or_default()),
                    }
                ));
            }
        }
    }
    (failures, notes)
}

#[test]
fn rootfs_symlinks_to_a_host_tree_change_nothing_on_the_host() {
    let Some(fx) = fixture("hostile") else { return };
    let started = Instant::now();
    let (failures, notes) = check_cases(&fx, &SENTINEL_CASES);
    eprintln!("{}\n({:?})", notes.join("\n"), started.elapsed());
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// Serializes the cases that point at the host's `/` across test processes:
/// each compares the host root before and after and cleans what the runtime left.
fn host_root_lock() -> fs::File {
    let lock = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open("/run/tessera-e2e-hostroot.lock")
        .expect("lock file");
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive).expect("flock");
    lock
}

#[test]
fn rootfs_symlinks_to_the_host_root_change_nothing_on_the_host() {
    let Some(fx) = fixture("hostile-root") else {
        return;
    };
    static LOCAL: Mutex<()> = Mutex::new(());
    let _local = LOCAL.lock().unwrap_or_else(|e| e.into_inner());
    let _lock = host_root_lock();
    let started = Instant::now();
    let (failures, notes) = check_cases(&fx, &HOST_ROOT_CASES);
    eprintln!("{}\n({:?})", notes.join("\n"), started.elapsed());
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// A thread that swaps `a` and `b` (one a directory, one a symlink to the
/// sentinel) with `renameat2(RENAME_EXCHANGE)` until stopped.
fn flipper(a: PathBuf, b: PathBuf, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut flips = 0;
        while !stop.load(Ordering::Relaxed) {
            if rustix::fs::renameat_with(
                rustix::fs::CWD,
                &a,
                rustix::fs::CWD,
                &b,
                rustix::fs::RenameFlags::EXCHANGE,
            )
            .is_ok()
            {
                flips += 1;
            }
        }
        flips
    })
}

#[test]
fn a_symlink_flipped_while_the_hook_runs_changes_nothing_on_the_host() {
    let Some(fx) = fixture("hostile-race") else {
        return;
    };
    let iterations: usize = std::env::var("TESSERA_E2E_RACE_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let started = Instant::now();
    let mut failures = Vec::new();
    let mut notes = Vec::new();
    for runtime in Runtime::ALL {
        for stage in STAGES {
            for link in ["usr/local/tessera", "etc"] {
                let what = format!("{runtime}, {stage}, {link} flipping");
                let n = next_n();
                let sentinel = fx.dir().join(format!("sentinel-race-{n}"));
                plant(&sentinel).expect("sentinel");
                let mut bundle = fx.bundle(SCRIPT).expect("bundle");
                let benign = bundle.rootfs().join(link);
                let flip = bundle.rootfs().join(format!("{link}.flip"));
                fs::create_dir_all(&benign).expect("benign dir");
                symlink(&sentinel, &flip).expect("flip symlink");
                let marker = fx.dir().join(format!("reached-race-{n}"));
                hooks_for(&fx, &mut bundle, stage, &marker, true);
                let before = snapshot(&sentinel).expect("snapshot");

                let stop = Arc::new(AtomicBool::new(false));
                let thread = flipper(benign.clone(), flip.clone(), stop.clone());
                let (mut ran, mut refused) = (0, 0);
                for _ in 0..iterations {
                    let out = run_bundle(runtime, &bundle, "race").expect("run");
                    match out.create_error {
                        None => ran += 1,
                        Some(_) => refused += 1,
                    }
                    if let Some(line) = out.output.lines().find(|l| l.contains(TOKEN)) {
                        failures.push(format!("{what}: the container read the sentinel: {line}"));
                    }
                }
                stop.store(true, Ordering::Relaxed);
                let flips = thread.join().expect("flipper");

                let after = snapshot(&sentinel).expect("snapshot");
                let changed = changes(&before, &after);
                if !changed.is_empty() {
                    failures.push(format!("{what}: host sentinel changed: {changed:?}"));
                }
                let mounts = mounts_under(&sentinel).expect("mountinfo");
                for m in &mounts {
                    let _ = std::process::Command::new("umount")
                        .args(["-l", m])
                        .status();
                }
                if !mounts.is_empty() {
                    failures.push(format!(
                        "{what}: host mounts under the sentinel: {mounts:?}"
                    ));
                }
                notes.push(format!(
                    "{what}: {iterations} runs ({ran} ran, {refused} refused), {flips} flips"
                ));
            }
        }
    }
    eprintln!("{}\n({:?})", notes.join("\n"), started.elapsed());
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}
