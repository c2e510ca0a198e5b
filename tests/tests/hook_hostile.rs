//! `tessera-hook` against hostile root filesystems (CVE-2024-0132 and kin),
//! under runc and crun, with the hook at `prestart` and at `createContainer`.
//!
//! Each case points a path the hook works on (`/dev`, `/usr/local/tessera`,
//! `/etc`, `/etc/ld.so.preload`) at a sentinel tree on the host, or at `/`, and
//! asserts that after the container's life the host is as it was and the
//! container read nothing of the sentinel. runc and crun themselves follow a
//! rootfs `/dev` symlink (they create their `/dev/stdin`-style links and device
//! nodes there), so every case is run twice: once with static no-op hooks in
//! the hook's place, once with the hook; the hook is blamed only for what the
//! second run changes beyond the first.
//!
//! A check that nothing happened means something only if the hook ran, so
//! every case first asks for the hook's trace in that container
//! ([`tessera_e2e::hooktrace`]): its binding record naming the container, or
//! its own refusal line naming the hostile path. A case the runtime refuses by
//! itself before any hook runs is not applicable for that runtime, and only
//! if the refusal reads as [`RUNTIME_REFUSALS`] says; anything else without a
//! trace fails. Each runtime must have cases where the hook ran.
//!
//! The test of the tests: the same checks with a naive hook in the hook's
//! place (one that follows the image's symlinks) must report it.
//!
//! The tests of this file run one at a time ([`serial`]): the race test's
//! rename flood makes `openat2(RESOLVE_IN_ROOT)` fail with `EAGAIN` anywhere
//! on the machine, which would make another case's hook refuse for that
//! reason instead of the hostile path. Outside the race test such a refusal
//! proves nothing.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tessera_e2e::hookenv;
use tessera_e2e::hookenv::{ALLOC_ANNOTATION, ALLOC_ID, HookFixture, static_noop};
use tessera_e2e::hooktrace::{HookUnderTest, Probe, Trace};
use tessera_e2e::sentinel::{HostRootView, TOKEN, changes, mounts_under, plant, snapshot};
use tessera_test_support::oci::{Bundle, HookEntry, Runtime, run_bundle_as};
use tessera_test_support::require;

const STAGES: [&str; 2] = ["prestart", "createContainer"];

/// What the hook's refusal says when `openat2(RESOLVE_IN_ROOT)` kept failing
/// with `EAGAIN` (a rename raced the lookup), not the hostile path itself.
const EAGAIN: &str = "Resource temporarily unavailable";

/// Runs the tests of this file one at a time: each holds the guard for its
/// whole run (a failed test's poisoning is ignored), so the race test's
/// rename flood never overlaps another case.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

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

/// A rootfs a runtime refuses by itself, before any hook runs: the case is
/// not applicable to that runtime, provided its error still says all of `says`
/// (so a change of the runtime's behaviour is noticed, not taken as a pass).
struct RuntimeRefusal {
    runtime: Runtime,
    /// The case's symlink.
    link: &'static str,
    /// Whether the symlink points at the host's `/` (else at the sentinel).
    host_root: bool,
    /// Fragments the runtime's error must contain.
    says: &'static [&'static str],
}

const RUNTIME_REFUSALS: [RuntimeRefusal; 2] = [
    // crun 1.8.1 opens the rootfs `/dev` with openat2(RESOLVE_IN_ROOT): the
    // absolute symlink resolves inside the rootfs, where it does not exist.
    RuntimeRefusal {
        runtime: Runtime::Crun,
        link: "dev",
        host_root: false,
        says: &["openat2 `dev`: No such file or directory"],
    },
    // runc 1.1.5 mounts its tmpfs on `/dev` through the symlink, then cannot
    // reopen the target inside the rootfs.
    RuntimeRefusal {
        runtime: Runtime::Runc,
        link: "dev",
        host_root: true,
        says: &[
            "error mounting \\\"tmpfs\\\" to rootfs at \\\"/dev\\\"",
            "no such file or directory",
        ],
    },
];

fn expected_refusal(runtime: Runtime, case: Case) -> Option<&'static RuntimeRefusal> {
    RUNTIME_REFUSALS.iter().find(|r| {
        r.runtime == runtime
            && r.link == case.link
            && r.host_root == matches!(case.target, Target::HostRoot)
    })
}

fn fixture(tag: &str) -> Option<HookFixture> {
    if require(&hookenv::needs(&["runc", "crun", "cc"])).is_err() {
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
    /// What the hook under test left about this container.
    trace: Option<Trace>,
}

/// Registers the hooks of a run: a static no-op that marks the stage as
/// reached, then at `stage` the hook under test (or a no-op) followed by the
/// binding witness, and the hook's poststop (or a no-op).
fn install_hooks(
    fx: &HookFixture,
    bundle: &mut Bundle,
    stage: &str,
    marker: &Path,
    hook: Option<HookUnderTest>,
    probe: &Probe,
) {
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
    probe.annotate(bundle);
    bundle.hook(stage, &reached);
    let (at_stage, at_poststop) = match hook {
        Some(hook) => (
            hook.entry(fx, "prestart").expect("hook entry"),
            hook.entry(fx, "poststop").expect("hook entry"),
        ),
        None => (plain.clone(), plain),
    };
    bundle
        .hook(stage, &at_stage)
        .hook(stage, &probe.witness_entry().expect("witness"))
        .hook("poststop", &at_poststop);
}

fn run_case(
    fx: &HookFixture,
    runtime: Runtime,
    stage: &str,
    case: Case,
    hook: Option<HookUnderTest>,
) -> CaseRun {
    let n = next_n();
    let sentinel = fx.dir().join(format!("sentinel-{n}"));
    plant(&sentinel).expect("sentinel");
    let mut bundle = fx.bundle(SCRIPT).expect("bundle");
    make_hostile(&bundle.rootfs(), case, &sentinel);
    let marker = fx.dir().join(format!("reached-{n}"));
    let probe = Probe::new(fx, fx.dir(), &format!("hostile-{n}"));
    install_hooks(fx, &mut bundle, stage, &marker, hook, &probe);

    let host_before = matches!(case.target, Target::HostRoot)
        .then(|| HostRootView::read().expect("host root view"));
    let before = snapshot(&sentinel).expect("snapshot");
    let outcome = run_bundle_as(runtime, &bundle, probe.container_id()).expect("run");
    let after = snapshot(&sentinel).expect("snapshot");
    let trace = probe.trace(runtime, &outcome);

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
        trace,
    }
}

/// How one case went under one runtime and stage.
#[derive(Debug)]
enum Verdict {
    /// The hook ran (its trace) and the host is as it was.
    Clean(Trace),
    /// The runtime refused the rootfs by itself, as expected: its error.
    NotApplicable(String),
    /// The hook ran and the host changed or the container read the sentinel.
    Breach(Vec<String>),
    /// The case proved nothing: no trace, or not the expected runtime refusal.
    Broken(String),
}

struct CaseResult {
    runtime: Runtime,
    what: String,
    verdict: Verdict,
}

fn last_line(error: Option<&str>) -> String {
    error
        .and_then(|e| e.trim_end().lines().last())
        .unwrap_or("container ran")
        .to_owned()
}

/// Runs one case, baseline then hook, and judges it.
fn check_case(
    fx: &HookFixture,
    runtime: Runtime,
    stage: &str,
    case: Case,
    hook: HookUnderTest,
) -> CaseResult {
    let what = format!(
        "{runtime}, {stage}, rootfs {} -> {:?}",
        case.link, case.target
    );
    let base = run_case(fx, runtime, stage, case, None);
    let hooked = run_case(fx, runtime, stage, case, Some(hook));
    let error = hooked.create_error.as_deref();
    let verdict = match (&hooked.trace, expected_refusal(runtime, case)) {
        (None, Some(refusal))
            if !hooked.reached
                && error.is_some_and(|e| refusal.says.iter().all(|s| e.contains(s))) =>
        {
            Verdict::NotApplicable(last_line(error))
        }
        (None, Some(refusal)) => Verdict::Broken(format!(
            "the runtime should refuse this rootfs before any hook, saying {:?}; hooks reached: {}, error: {}",
            refusal.says,
            hooked.reached,
            last_line(error)
        )),
        (None, None) => Verdict::Broken(format!(
            "{hook} left no trace (hooks reached: {}): {}",
            hooked.reached,
            last_line(error)
        )),
        (Some(trace), Some(_)) => Verdict::Broken(format!(
            "listed in RUNTIME_REFUSALS, yet {hook} ran ({trace}): the runtime changed, update the list"
        )),
        (Some(Trace::Refused { line }), None) if line.contains(EAGAIN) => Verdict::Broken(format!(
            "{hook} refused on EAGAIN (a concurrent rename), not for the hostile /{}: {line}",
            case.link
        )),
        (Some(Trace::Refused { line }), None) if !line.contains(&format!(" /{}", case.link)) => {
            Verdict::Broken(format!(
                "{hook} refused for another reason than the hostile /{}: {line}",
                case.link
            ))
        }
        (Some(trace), None) => {
            let mut findings = Vec::new();
            let extra: Vec<_> = hooked.sentinel.difference(&base.sentinel).collect();
            if !extra.is_empty() {
                findings.push(format!("{hook} changed the host sentinel: {extra:?}"));
            }
            let extra_root: Vec<_> = hooked.host_root.difference(&base.host_root).collect();
            if !extra_root.is_empty() {
                findings.push(format!("{hook} changed the host's /: {extra_root:?}"));
            }
            if !hooked.mounts.is_empty() {
                findings.push(format!(
                    "host mounts under the sentinel: {:?}",
                    hooked.mounts
                ));
            }
            if let Some(line) = &hooked.leaked {
                findings.push(format!("the container read the sentinel: {line}"));
            }
            if findings.is_empty() {
                Verdict::Clean(trace.clone())
            } else {
                findings.push(format!("({trace})"));
                Verdict::Breach(findings)
            }
        }
    };
    CaseResult {
        runtime,
        what,
        verdict,
    }
}

/// Every case under both runtimes and stages with `hook`.
fn check_cases(fx: &HookFixture, cases: &[Case], hook: HookUnderTest) -> Vec<CaseResult> {
    let mut results = Vec::new();
    for case in cases {
        for runtime in Runtime::ALL {
            for stage in STAGES {
                results.push(check_case(fx, runtime, stage, *case, hook));
            }
        }
    }
    results
}

/// One line per case, then the counts per runtime.
fn report(results: &[CaseResult]) -> String {
    let mut lines: Vec<String> = results
        .iter()
        .map(|r| match &r.verdict {
            Verdict::Clean(trace) => format!("{}: hook {trace}; host unchanged", r.what),
            Verdict::NotApplicable(e) => {
                format!("{}: NOT APPLICABLE, runtime refused: {e}", r.what)
            }
            Verdict::Breach(f) => format!("{}: BREACH: {}", r.what, f.join("; ")),
            Verdict::Broken(why) => format!("{}: PROVES NOTHING: {why}", r.what),
        })
        .collect();
    for runtime in Runtime::ALL {
        let count = |f: fn(&Verdict) -> bool| {
            results
                .iter()
                .filter(|r| r.runtime == runtime && f(&r.verdict))
                .count()
        };
        lines.push(format!(
            "{runtime}: {} clean, {} not applicable, {} breaches, {} proving nothing",
            count(|v| matches!(v, Verdict::Clean(_))),
            count(|v| matches!(v, Verdict::NotApplicable(_))),
            count(|v| matches!(v, Verdict::Breach(_))),
            count(|v| matches!(v, Verdict::Broken(_))),
        ));
    }
    lines.join("\n")
}

/// Runs `cases` against tessera-hook, saying how long they took, and asserts
/// it held: no breach, no case proving nothing, and for each runtime at least
/// one case where the hook ran.
fn assert_hook_holds(fx: &HookFixture, cases: &[Case]) {
    let started = Instant::now();
    let results = check_cases(fx, cases, HookUnderTest::Tessera);
    eprintln!("({:?})", started.elapsed());
    let report = report(&results);
    eprintln!("{report}");
    let bad: Vec<&str> = results
        .iter()
        .filter(|r| matches!(r.verdict, Verdict::Breach(_) | Verdict::Broken(_)))
        .map(|r| r.what.as_str())
        .collect();
    assert!(bad.is_empty(), "failed: {bad:?}\n{report}");
    for runtime in Runtime::ALL {
        assert!(
            results
                .iter()
                .any(|r| r.runtime == runtime && matches!(r.verdict, Verdict::Clean(_))),
            "{runtime}: no case where the hook ran counts\n{report}"
        );
    }
}

/// The assertion of the test of the tests: no case of the naive hook passes
/// for want of a trace, and every case where the hook ran reports it, but
/// those in `shielded` (where what the runtime mounted first may take its
/// writes); each runtime catches it at least once.
fn assert_naive_hook_caught(results: &[CaseResult], shielded: &[&str]) {
    let report = report(results);
    eprintln!("{report}");
    let broken: Vec<&str> = results
        .iter()
        .filter(|r| matches!(r.verdict, Verdict::Broken(_)))
        .map(|r| r.what.as_str())
        .collect();
    assert!(
        broken.is_empty(),
        "cases proving nothing: {broken:?}\n{report}"
    );
    let missed: Vec<&str> = results
        .iter()
        .filter(|r| matches!(r.verdict, Verdict::Clean(_)))
        .map(|r| r.what.as_str())
        .filter(|what| !shielded.iter().any(|s| what.starts_with(s)))
        .collect();
    assert!(
        missed.is_empty(),
        "cases that let the naive hook through: {missed:?}\n{report}"
    );
    for runtime in Runtime::ALL {
        assert!(
            results
                .iter()
                .any(|r| r.runtime == runtime && matches!(r.verdict, Verdict::Breach(_))),
            "{runtime}: the checks did not catch the naive hook\n{report}"
        );
    }
}

#[test]
fn rootfs_symlinks_to_a_host_tree_change_nothing_on_the_host() {
    let _serial = serial();
    let Some(fx) = fixture("hostile") else { return };
    assert_hook_holds(&fx, &SENTINEL_CASES);
}

#[test]
fn naive_hook_is_caught_by_hostile_checks() {
    let _serial = serial();
    let Some(fx) = fixture("hostile-naive") else {
        return;
    };
    let results = check_cases(&fx, &SENTINEL_CASES, HookUnderTest::Naive);
    assert_naive_hook_caught(&results, &[]);
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
    let _serial = serial();
    let Some(fx) = fixture("hostile-root") else {
        return;
    };
    let _lock = host_root_lock();
    assert_hook_holds(&fx, &HOST_ROOT_CASES);
}

#[test]
fn naive_hook_is_caught_by_host_root_checks() {
    let _serial = serial();
    let Some(fx) = fixture("hostile-root-naive") else {
        return;
    };
    let _lock = host_root_lock();
    let results = check_cases(&fx, &HOST_ROOT_CASES, HookUnderTest::Naive);
    // At createContainer the hook runs in the container's mount namespace,
    // where crun has already mounted its /dev tmpfs through the symlink on /.
    assert_naive_hook_caught(&results, &["crun, createContainer, rootfs dev -> HostRoot"]);
}

/// A thread that swaps `a` and `b` (one a directory, one a symlink to the
/// sentinel) with `renameat2(RENAME_EXCHANGE)` until stopped, in bursts:
/// a storm of back-to-back swaps (1–4 ms), then a calm (1–4 ms) with the
/// directory in place. Storms are the race; calms let some runs finish,
/// which a flipper that never rests denies on a loaded 2-core machine (the
/// hook then refuses almost every run, and the test cannot show that it
/// also binds). Returns the number of swaps made.
fn flipper(a: PathBuf, b: PathBuf, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let exchange = || {
            rustix::fs::renameat_with(
                rustix::fs::CWD,
                &a,
                rustix::fs::CWD,
                &b,
                rustix::fs::RenameFlags::EXCHANGE,
            )
            .is_ok()
        };
        // xorshift64, seeded from the clock: phase lengths only, so any
        // seed will do.
        let mut seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0x9e37_79b9, |d| d.as_nanos() as u64)
            | 1;
        let mut phase = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            Duration::from_micros(1_000 + seed % 3_000)
        };
        let mut flips = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let storm_end = Instant::now() + phase();
            while Instant::now() < storm_end && !stop.load(Ordering::Relaxed) {
                if exchange() {
                    flips += 1;
                }
            }
            // An odd count leaves the symlink where the directory was.
            if flips % 2 == 1 && exchange() {
                flips += 1;
            }
            std::thread::sleep(phase());
        }
        flips
    })
}

/// Reads a number from the environment, else `default`.
fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn a_symlink_flipped_while_the_hook_runs_changes_nothing_on_the_host() {
    let _serial = serial();
    let Some(fx) = fixture("hostile-race") else {
        return;
    };
    // Runs in which a container started with the hook bound, and runs the
    // hook refused on the swapped-in symlink, per combination: which one a
    // run ends in depends on where the flipper is, so the test runs until
    // it has this many of each or its time is up.
    let min_started = env_number("TESSERA_E2E_RACE_MIN_STARTED", 8);
    let min_refused = env_number("TESSERA_E2E_RACE_MIN_REFUSED", 8);
    let budget = Duration::from_secs(env_number("TESSERA_E2E_RACE_BUDGET_S", 60));
    let started_at = Instant::now();
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
                let tag = format!("race-{n}");
                let mut probe = Probe::new(&fx, fx.dir(), &tag);
                install_hooks(
                    &fx,
                    &mut bundle,
                    stage,
                    &marker,
                    Some(HookUnderTest::Tessera),
                    &probe,
                );
                let before = snapshot(&sentinel).expect("snapshot");

                let stop = Arc::new(AtomicBool::new(false));
                let thread = flipper(benign.clone(), flip.clone(), stop.clone());
                let deadline = Instant::now() + budget;
                let (mut runs, mut started, mut hook_refused, mut hook_raced) = (0, 0, 0, 0);
                let mut other = Vec::new();
                while (started < min_started || hook_refused < min_refused)
                    && Instant::now() < deadline
                {
                    probe.next_run(&tag);
                    runs += 1;
                    let out = run_bundle_as(runtime, &bundle, probe.container_id()).expect("run");
                    let trace = probe.trace(runtime, &out);
                    if let Some(line) = out.output.lines().find(|l| l.contains(TOKEN)) {
                        failures.push(format!("{what}: the container read the sentinel: {line}"));
                    }
                    match (&out.create_error, trace) {
                        (None, Some(Trace::Bound { .. })) => started += 1,
                        (None, trace) => failures.push(format!(
                            "{what}: a container ran without the hook's binding ({trace:?})"
                        )),
                        // The hook's lookup met the swapped-in symlink, or
                        // kept losing the race (EAGAIN) and gave up: both
                        // refusals of the hostile path.
                        (Some(_), Some(Trace::Refused { line }))
                            if line.contains(&format!(" /{link}")) =>
                        {
                            if line.contains(EAGAIN) {
                                hook_raced += 1;
                            } else {
                                hook_refused += 1;
                            }
                        }
                        (Some(e), trace) => other.push(format!(
                            "{} ({})",
                            last_line(Some(e)),
                            trace.map_or("no trace".to_owned(), |t| t.to_string())
                        )),
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
                if flips == 0 {
                    failures.push(format!(
                        "{what}: the symlink was never swapped in: the race proves nothing"
                    ));
                }
                if hook_refused < min_refused {
                    failures.push(format!(
                        "{what}: in {runs} runs the hook met the swapped-in symlink only {hook_refused} times \
                         (need {min_refused}, TESSERA_E2E_RACE_MIN_REFUSED; {hook_raced} EAGAIN refusals) \
                         within {budget:?}: the race proves too little"
                    ));
                }
                if !other.is_empty() {
                    failures.push(format!(
                        "{what}: {} runs ended neither bound nor refused by the hook for /{link}: {other:?}",
                        other.len()
                    ));
                }
                if started < min_started {
                    failures.push(format!(
                        "{what}: only {started} of {runs} runs started a container with the hook bound \
                         (need {min_started}, TESSERA_E2E_RACE_MIN_STARTED) within {budget:?}"
                    ));
                }
                let n_other = other.len();
                other.sort();
                other.dedup();
                notes.push(format!(
                    "{what}: {runs} runs: {started} started with the hook bound, {hook_refused} refused by the hook \
                     (symlink caught), {hook_raced} refused by the hook on EAGAIN, {n_other} other ({other:?}); \
                     {flips} flips"
                ));
            }
        }
    }
    eprintln!("{}\n({:?})", notes.join("\n"), started_at.elapsed());
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}
