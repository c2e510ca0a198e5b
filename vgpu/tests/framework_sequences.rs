//! The call sequences real frameworks make, against a 1 GiB slice of a
//! simulated 80 GiB GPU: each one held more than the slice (or broke a
//! legal program) before the library followed the life of what it counts.
//! Every sequence is a `tessera-cuda-probe script` (the driver reached
//! through `cuGetProcAddress_v2`, as the CUDA runtime reaches it), and each
//! test that claims a refusal also shows that the driver alone would have
//! granted the memory (the program is legal; only the slice says no).
//!
//! Items of issue 8, in order: concurrent processes (1), failing closed
//! (2), VMM lifetimes (3), stream-ordered pools and per-stream devices (4),
//! context teardown (5), pid namespaces (6), unhooked reservations (7),
//! contexts' own memory (8).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::sequences::{
    ALLOC_256, alloc_256, demo_with_1_gib, hold_256, memory_limits, preloaded,
};
use common::{
    MIB, Need, Node, Output, artefacts, expect_steps, held_by, held_on_gpu, is_root, require, steps,
};

const SLICE_MIB: u64 = 1024;

/// A node with the 1 GiB slice for a test that needs root (`why`); `None`
/// after a skip otherwise.
fn node_as_root(why: &str) -> Option<(Node, PathBuf)> {
    let a = artefacts()?;
    require(&[Need::condition(
        is_root(),
        format!("root: {why}"),
        "run as root",
    )])
    .ok()?;
    let node = Node::create(a, "demo");
    let limits = node.gpu0_slice(SLICE_MIB);
    Some((node, limits))
}

/// Runs a script with the library (`limits`) or without it (`None`).
fn script(node: &Node, limits: Option<&Path>, steps: &[&str]) -> Output {
    node.probe(limits).arg("script").args(steps).run()
}

/// Runs `steps` without the library, where every step succeeds (the
/// program is legal), then with it (`limits`), where the steps end as
/// `expected`; the output of the run with the library.
fn script_in_slice(node: &Node, limits: &Path, steps: &[&str], expected: &[&str]) -> Output {
    expect_steps(&script(node, None, steps), &vec!["ok"; steps.len()]);
    let out = script(node, Some(limits), steps);
    expect_steps(&out, expected);
    out
}

// ---------------------------------------------------------------------------
// 1. Concurrent processes share one budget, under sustained refusals
// ---------------------------------------------------------------------------

/// A `stress` process: `threads` threads of random allocations and frees
/// over every API until `ops` each, then holding what they have.
struct Stresser {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
    seen: String,
}

impl Stresser {
    fn start(
        node: &Node,
        limits: &Path,
        seed: u64,
        threads: usize,
        ops: usize,
        hold: bool,
    ) -> Stresser {
        let mut cmd = node
            .probe(Some(limits))
            .env("TESSERA_SIM_CUDA_PUBLISH_ON_MEMORY", "1")
            .args(["stress", "--seed", &seed.to_string()])
            .args(["--threads", &threads.to_string(), "--ops", &ops.to_string()])
            .0;
        if hold {
            cmd.arg("--hold");
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start tessera-cuda-probe stress");
        let out = BufReader::new(child.stdout.take().expect("stdout"));
        Stresser {
            child,
            out,
            seen: String::new(),
        }
    }

    /// Reads lines until `key=value` with this key; its value.
    fn until(&mut self, key: &str) -> String {
        loop {
            let mut line = String::new();
            let n = self.out.read_line(&mut line).expect("read stress output");
            assert!(n > 0, "stress ended before {key}=: {}", self.seen);
            self.seen.push_str(&line);
            if let Some(v) = line.trim_end().strip_prefix(&format!("{key}=")) {
                return v.to_owned();
            }
        }
    }

    fn release(&mut self) {
        if let Some(stdin) = self.child.stdin.as_mut() {
            let _ = writeln!(stdin);
        }
    }
}

impl Drop for Stresser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The processes a watcher stops to read a consistent total.
type Watched = std::sync::Mutex<Vec<u32>>;

/// A fresh process is told the whole slice is free, and gets it in one block.
fn assert_the_whole_slice_is_free(node: &Node, limits: &Path) {
    let fresh = script(
        node,
        Some(limits),
        &["retain 0", "info start", "alloc all 1024"],
    );
    expect_steps(&fresh, &["ok", "ok", "ok"]);
    assert_eq!(
        fresh.num("start.free"),
        SLICE_MIB * MIB,
        "{}",
        fresh.describe()
    );
}

/// Whether a `/proc/…/stat` line shows a stopped (or dead) task.
fn stat_stopped(stat: &str) -> bool {
    stat.rsplit_once(')').is_none_or(|(_, rest)| {
        matches!(
            rest.trim_start().chars().next(),
            Some('T' | 't' | 'Z' | 'X')
        )
    })
}

/// Whether every thread of `pid` is stopped (or the process is gone).
/// `/proc/<pid>/stat` shows only the thread-group leader, which stops
/// first: the others stop as they next run, and under load one of them
/// was still running (state R) in about half the snapshots.
fn stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    tasks.flatten().all(|task| {
        std::fs::read_to_string(task.path().join("stat")).map_or(true, |stat| stat_stopped(&stat))
    })
}

/// What each of `pids` last published and had charged in the region, and
/// the region's total for the container (every device summed: these tests
/// use GPU 0 only). A failure then tells a measuring fault (each process
/// within its charge, the total within the slice) from an over-grant.
fn breakdown(node: &Node, pids: &[u32]) -> String {
    use tessera_vgpu::accounting::{MAX_DEVICES, MAX_PROCESSES, layout};
    let region = std::fs::read(
        node.accounting
            .join(tessera_model::contract::vgpu::ACCOUNTING_FILE),
    )
    .unwrap_or_default();
    let word = |at: usize| {
        region
            .get(at..at + 8)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u64::from_le_bytes)
    };
    let devices = |base: usize, stride: usize| -> u64 {
        (0..MAX_DEVICES).map(|d| word(base + d * stride)).sum()
    };
    let charged = |pid: u32| -> u64 {
        (0..MAX_PROCESSES)
            .map(|i| layout::SLOTS + i * layout::SLOT_SIZE)
            .filter(|&at| word(at + layout::SLOT_PID) as u32 == pid)
            .map(|at| devices(at + layout::SLOT_USED, 8))
            .sum()
    };
    let mut text = String::new();
    for &pid in pids {
        let (published, _) = held_by(&node.root, 0, Some(&[pid]));
        text.push_str(&format!(
            "pid {pid}: published {published} B, charged {} B; ",
            charged(pid)
        ));
    }
    let total = devices(layout::DEVICES + layout::DEVICE_USED, layout::DEVICE_SIZE);
    text.push_str(&format!("region total {total} B"));
    text
}

/// Watches what the simulated GPU holds for the container while `body`
/// runs: again and again, stops every watched process (SIGSTOP, waiting
/// until every thread of each is stopped), reads what each last published,
/// and lets them go on. With the processes stopped the total is a true snapshot: a
/// process caught inside a free may still show the freed memory, but no
/// other process can have been granted it yet (the library gives a charge
/// back only after the driver's free returned, and the driver published
/// before returning). A process being killed is taken off the list first.
/// Returns `body`'s result, the largest total seen, the number of
/// snapshots, and for the largest total over the slice (if any) what each
/// process showed and what the region counted, for the failure message.
fn watching<R>(node: &Node, pids: &Watched, body: impl FnOnce() -> R) -> (R, u64, u64, String) {
    let root = node.root.as_path();
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let watcher = s.spawn(|| {
            let (mut max, mut snapshots, mut worst) = (0u64, 0u64, String::new());
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let list = pids.lock().expect("pids").clone();
                for &pid in &list {
                    // SAFETY: signals a child process this test started.
                    unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
                }
                let deadline = Instant::now() + Duration::from_secs(2);
                while !list.iter().all(|&p| stopped(p)) && Instant::now() < deadline {
                    std::hint::spin_loop();
                }
                let all_stopped = list.iter().all(|&p| stopped(p));
                // Only the watched processes: one being killed right now
                // has let go of its slot (its descriptors are closed, as a
                // real driver's are when it frees the memory) before /proc
                // shows it dead.
                let (held, _) = held_by(root, 0, Some(&list));
                if all_stopped && held > max && held > SLICE_MIB * MIB {
                    worst = breakdown(node, &list);
                }
                for &pid in &list {
                    // SAFETY: as above.
                    unsafe { libc::kill(pid as i32, libc::SIGCONT) };
                }
                if all_stopped {
                    max = max.max(held);
                    snapshots += 1;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            (max, snapshots, worst)
        });
        let r = body();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        let (max, snapshots, worst) = watcher.join().expect("watcher");
        (r, max, snapshots, worst)
    })
}

#[test]
fn four_processes_running_into_the_limit_hold_no_more_than_it_together() {
    let Some((node, limits)) = demo_with_1_gib() else {
        return;
    };
    let pids = Watched::default();
    let (held, max_seen, readings, worst) = watching(&node, &pids, || {
        let mut procs: Vec<Stresser> = (1..=4)
            .map(|seed| Stresser::start(&node, &limits, seed, 2, 300, true))
            .collect();
        pids.lock()
            .expect("pids")
            .extend(procs.iter().map(|p| p.child.id()));
        let mut held = 0u64;
        for p in &mut procs {
            held += p.until("held_bytes").parse::<u64>().expect("bytes");
            let refused: u64 = p
                .seen
                .lines()
                .find_map(|l| l.strip_prefix("refused="))
                .and_then(|v| v.parse().ok())
                .expect("refused=");
            assert!(refused > 0, "each process ran into the limit: {}", p.seen);
            let errors = p
                .seen
                .lines()
                .find_map(|l| l.strip_prefix("errors="))
                .unwrap_or("?");
            assert_eq!(errors, "0", "only refusals, no other error: {}", p.seen);
            p.until("state");
        }
        let (on_gpu, holders) = held_on_gpu(&node.root, 0);
        assert_eq!(holders, 4, "all four still hold their blocks");
        assert!(
            on_gpu <= SLICE_MIB * MIB,
            "the GPU holds {on_gpu} bytes for the four, more than the slice"
        );
        pids.lock().expect("pids").clear();
        for p in &mut procs {
            p.release();
        }
        for mut p in procs {
            let _ = p.child.wait();
        }
        held
    });
    assert!(
        held <= SLICE_MIB * MIB,
        "the four hold {held} bytes of blocks together"
    );
    assert!(readings > 10, "the watcher read the GPU {readings} times");
    assert!(
        max_seen <= SLICE_MIB * MIB,
        "at some point the GPU held {max_seen} bytes for the container: {worst}"
    );
    // And what they left is the whole slice again.
    assert_the_whole_slice_is_free(&node, &limits);
}

// ---------------------------------------------------------------------------
// 2. Fail closed
// ---------------------------------------------------------------------------

/// A process holding 768 MiB (three 256 MiB blocks) of the slice.
fn hold_768(node: &Node, limits: &Path) -> common::Holding {
    hold_256(node, limits, 3, "30")
}

#[test]
fn hami_variables_without_a_shared_file_refuse_every_allocation() {
    let Some(a) = artefacts() else { return };
    let Ok(()) = require(&[Need::absent(
        "/var/run/tessera/vgpu.accounting",
        "the test needs the default region file absent",
    )]) else {
        return;
    };
    let node = Node::create(a, "demo");
    let out = alloc_256(
        preloaded(&node).env("CUDA_DEVICE_MEMORY_LIMIT_0", "512m"),
        4,
    );
    assert_eq!(out.num("blocks"), 0, "{}", out.describe());
    assert_eq!(out.get("result"), "CUDA_ERROR_OUT_OF_MEMORY");
    assert_eq!(
        out.num("mem_free_bytes"),
        0,
        "nothing is free: {}",
        out.describe()
    );
    let lines = out.library_lines();
    let cause: Vec<&&str> = lines
        .iter()
        .filter(|l| l.contains("failing closed"))
        .collect();
    assert_eq!(cause.len(), 1, "one line: {lines:?}");
    assert!(
        cause[0].contains("/var/run/tessera/vgpu.accounting"),
        "{}",
        cause[0]
    );
    // Without the library the same program gets its memory (it is legal).
    let native = alloc_256(node.probe(None), 4);
    assert_eq!(native.num("blocks"), 4);
}

#[test]
fn an_accounting_directory_others_may_write_refuses_every_allocation() {
    use std::os::unix::fs::PermissionsExt;
    let Some((node, limits)) = demo_with_1_gib() else {
        return;
    };
    std::fs::set_permissions(&node.accounting, std::fs::Permissions::from_mode(0o777))
        .expect("chmod");
    let out = alloc_256(node.probe(Some(&limits)), 4);
    assert_eq!(out.num("blocks"), 0, "{}", out.describe());
    let lines = out.library_lines();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("mode 0777") && l.contains("failing closed")),
        "{lines:?}"
    );
}

#[test]
fn a_process_holding_a_lock_on_the_region_changes_nothing() {
    let Some((node, limits)) = demo_with_1_gib() else {
        return;
    };
    let region = node.accounting.join("vgpu.accounting");
    let Ok(()) = require(&[Need::Program("flock")]) else {
        return;
    };
    // `flock` opens the file read-only and holds an exclusive flock.
    let mut locker = match Command::new("flock")
        .arg("-x")
        .arg(&region)
        .args(["sleep", "60"])
        .spawn()
    {
        Ok(c) => c,
        Err(e) => panic!("running flock: {e}"),
    };
    std::thread::sleep(Duration::from_millis(100));
    let started = Instant::now();
    let first = hold_768(&node, &limits);
    let second = alloc_256(node.probe(Some(&limits)), 4);
    let elapsed = started.elapsed();
    let _ = locker.kill();
    let _ = locker.wait();
    assert_eq!(first.output().get("blocks").map(String::as_str), Some("3"));
    assert_eq!(second.num("blocks"), 1, "one budget: {}", second.describe());
    assert!(
        elapsed < Duration::from_secs(5),
        "nobody waited for the lock: {elapsed:?}"
    );
}

#[test]
fn the_workload_cannot_unlink_or_replace_the_region() {
    use std::os::unix::fs::PermissionsExt;
    let Some((node, limits)) = node_as_root("changing to another uid needs root") else {
        return;
    };
    // The workload runs as an unprivileged user who can reach the files.
    for dir in [node.work.as_path(), node.root.as_path()] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let region = node.accounting.join("vgpu.accounting");
    let as_nobody = |args: &[&str]| {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .args(args)
            .output()
            .expect("setpriv (util-linux)")
    };
    let region_text = region.to_str().expect("utf-8");
    assert!(
        !as_nobody(&["rm", "-f", region_text]).status.success(),
        "unlink refused"
    );
    let elsewhere = node.work.join("other");
    std::fs::write(&elsewhere, b"x").expect("write");
    std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    assert!(
        !as_nobody(&["mv", "-f", elsewhere.to_str().expect("utf-8"), region_text])
            .status
            .success(),
        "replace refused"
    );
    assert!(region.exists());
    // And the unprivileged workload shares the budget with root's processes.
    let holder = hold_768(&node, &limits);
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(&node.a.probe)
        .args(ALLOC_256)
        .arg("4")
        .env("LD_PRELOAD", &node.a.lib)
        .env("LD_LIBRARY_PATH", &node.libdir)
        .env("TESSERA_VGPU_CONFIG", &limits)
        .output()
        .expect("run as nobody");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("blocks=1\n"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(holder);
}

// ---------------------------------------------------------------------------
// 3. VMM lifetimes
// ---------------------------------------------------------------------------

#[test]
fn vmm_memory_counts_until_its_last_mapping_and_reference_go() {
    let Some((node, limits)) = demo_with_1_gib() else {
        return;
    };
    // The CUDA samples: release right after map; the mapping keeps the memory.
    let samples = [
        "retain 0",
        "vmm h 1024 0",
        "reserve va 1024",
        "map va h",
        "release-handle h",
        "vmm more 1024 0",
        "unmap va",
        "vmm after 1024 0",
    ];
    let expected = ["ok", "ok", "ok", "ok", "ok", "oom", "ok", "ok"];
    script_in_slice(&node, &limits, &samples, &expected);
    // NCCL: retain the handle of a mapping, release it, release the
    // original; the mapping still holds the memory.
    let nccl = [
        "retain 0",
        "vmm h 512 0",
        "reserve va 512",
        "map va h",
        "retain-handle again va",
        "release-handle again",
        "release-handle h",
        "vmm more 768 0",
        "address-free va",
        "vmm after 768 0",
    ];
    let expected = ["ok", "ok", "ok", "ok", "ok", "ok", "ok", "oom", "ok", "ok"];
    script_in_slice(&node, &limits, &nccl, &expected);
    // An import of the process's own export is one more reference.
    let import = [
        "retain 0",
        "vmm h 512 0",
        "export fd h",
        "import mine fd",
        "release-handle h",
        "vmm more 768 0",
        "release-handle mine",
        "vmm after 768 0",
    ];
    let expected = ["ok", "ok", "ok", "ok", "ok", "oom", "ok", "ok"];
    script_in_slice(&node, &limits, &import, &expected);
}

// ---------------------------------------------------------------------------
// 4. Stream-ordered pools and per-stream devices
// ---------------------------------------------------------------------------

#[test]
fn what_a_pool_keeps_stays_charged_until_it_gives_it_back() {
    let Some((node, limits)) = demo_with_1_gib() else {
        return;
    };
    // PyTorch's cudaMallocAsync backend: the pool keeps everything.
    let keep_all = [
        "retain 0",
        "pool-threshold 0 max",
        "async a 600 null",
        "free-async a null",
        "sync",
        "alloc other 600",
        "async again 600 null",
        "free-async again null",
        "pool-trim 0 0",
        "alloc other2 600",
        "info end",
    ];
    let expected = [
        "ok", "ok", "ok", "ok", "ok", "oom", "ok", "ok", "ok", "ok", "ok",
    ];
    let out = script_in_slice(&node, &limits, &keep_all, &expected);
    assert_eq!(
        out.num("end.free"),
        (SLICE_MIB - 600) * MIB,
        "{}",
        out.describe()
    );
    // The default threshold (0): what a synchronisation gives back is free again.
    let default = [
        "retain 0",
        "async a 600 null",
        "free-async a null",
        "sync",
        "alloc other 600",
        "info end",
    ];
    let out = script(&node, Some(&limits), &default);
    expect_steps(&out, &["ok"; 6]);
    assert_eq!(out.num("end.free"), (SLICE_MIB - 600) * MIB);
}

#[test]
fn stream_ordered_memory_is_charged_to_the_streams_device() {
    let Some(a) = artefacts() else { return };
    let node = Node::create(a, "bench-8xh100");
    let limits = memory_limits(&node, &[1024, 512]);
    let steps_ = [
        "retain 0",
        "stream s1 1",
        "async big 600 s1",
        "async a 400 s1",
        "info gpu0",
        "pop",
        "async b 200 s1",
        "async c 100 s1",
    ];
    let run = |limits: Option<&Path>| {
        node.probe(limits)
            .env("CUDA_VISIBLE_DEVICES", "0,1")
            .arg("script")
            .args(steps_)
            .run()
    };
    expect_steps(&run(None), &["ok"; 8]);
    let out = run(Some(&limits));
    // GPU 0 is current, the stream is GPU 1's: GPU 1's 512 MiB apply; with
    // no current context at all, still GPU 1's.
    expect_steps(&out, &["ok", "ok", "oom", "ok", "ok", "ok", "oom", "ok"]);
    assert_eq!(out.num("gpu0.free"), 1024 * MIB, "nothing charged to GPU 0");
}

// ---------------------------------------------------------------------------
// 5. Context teardown
// ---------------------------------------------------------------------------

#[test]
fn memory_a_context_takes_with_it_is_given_back() {
    let Some((node, limits)) = demo_with_1_gib() else {
        return;
    };
    let cases: [&[&str]; 3] = [
        // cuCtxDestroy.
        &[
            "ctx-create c 0",
            "alloc a 800",
            "ctx-destroy c",
            "retain 0",
            "alloc b 800",
            "info end",
        ],
        // The last cuDevicePrimaryCtxRelease.
        &[
            "retain 0",
            "alloc a 800",
            "release 0",
            "retain 0",
            "alloc b 800",
            "info end",
        ],
        // cudaDeviceReset() = cuDevicePrimaryCtxReset, with stream-ordered memory too.
        &[
            "retain 0",
            "alloc a 600",
            "async p 200 null",
            "reset 0",
            "alloc b 800",
            "info end",
        ],
    ];
    for case in cases {
        let out = script_in_slice(&node, &limits, case, &["ok"; 6]);
        assert_eq!(
            out.num("end.free"),
            (SLICE_MIB - 800) * MIB,
            "cuMemGetInfo: {case:?}"
        );
    }
}

// ---------------------------------------------------------------------------
// 6. Pid namespaces: a restarted container
// ---------------------------------------------------------------------------

#[test]
fn a_container_restarted_after_a_crash_finds_its_slice_free() {
    let Some((node, limits)) = node_as_root("pid namespaces (unshare --pid) need root") else {
        return;
    };
    // A container: a new pid namespace whose init is a shell, and the CUDA
    // program its child (pid 2, as under tini or torchrun).
    let in_container = || {
        node.command(Path::new("unshare"), None)
            .args(["--pid", "--fork", "--kill-child", "--mount-proc"])
            .args(["sh", "-c", "\"$0\" \"$@\"; exit $?"])
            .arg(&node.a.probe)
            .args(ALLOC_256)
            .env("LD_PRELOAD", &node.a.lib)
            .env("TESSERA_VGPU_CONFIG", &limits)
    };
    // The first container holds 768 MiB, and crashes.
    let crashed = in_container()
        .args(["3", "--hold-secs", "60"])
        .start_holding();
    drop(crashed); // SIGKILL to unshare; --kill-child takes the rest
    // The restarted container, in a new pid namespace where the same pid
    // numbers mean other processes, gets the whole slice (a few tries: the
    // crashed processes take a moment to die).
    let mut tries = 0;
    loop {
        let out = in_container().arg("4").run();
        tries += 1;
        if out.num("blocks") == 4 {
            break;
        }
        assert!(
            tries < 10,
            "slice still taken after {tries} tries: {}",
            out.describe()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

// ---------------------------------------------------------------------------
// 7. Unhooked reservations
// ---------------------------------------------------------------------------

#[test]
fn a_malloc_heap_is_charged_before_the_driver_takes_it() {
    let Some((node, limits)) = demo_with_1_gib() else {
        return;
    };
    let case = [
        "retain 0",
        "heap 512",
        "alloc a 600",
        "heap 2048",
        "heap 0",
        "alloc b 600",
        "info end",
    ];
    let expected = ["ok", "ok", "oom", "oom", "ok", "ok", "ok"];
    let out = script_in_slice(&node, &limits, &case, &expected);
    assert_eq!(out.num("end.free"), (SLICE_MIB - 600) * MIB);
}

#[test]
fn a_library_loaded_with_rtld_deepbind_is_still_counted() {
    let Some((node, limits)) = demo_with_1_gib() else {
        return;
    };
    let libdir = node.libdir.to_str().expect("utf-8").to_owned();
    let Some(plugin) = node.compile_c(
        "deepbind_plugin",
        "libplugin.so",
        &["-shared", "-fPIC", "-L", &libdir, "-l:libcuda.so.1"],
    ) else {
        return;
    };
    let Some(main) = node.compile_c("deepbind_main", "deepbind_main", &[]) else {
        return;
    };
    let run = |limits: Option<&Path>| node.command(&main, limits).arg(&plugin).run();
    let native = run(None);
    native.expect_success();
    assert_eq!(native.get("direct"), "0", "{}", native.describe());
    assert_eq!(native.get("dlsym"), "0", "{}", native.describe());
    let out = run(Some(&limits));
    out.expect_success();
    assert_eq!(
        out.get("direct"),
        "2",
        "direct call counted: {}",
        out.describe()
    );
    assert_eq!(
        out.get("dlsym"),
        "2",
        "its dlsym answered too: {}",
        out.describe()
    );
}

// ---------------------------------------------------------------------------
// 8. Contexts' own memory
// ---------------------------------------------------------------------------

#[test]
fn every_contexts_own_memory_counts_against_the_slice() {
    let Some((node, limits)) = demo_with_1_gib() else {
        return;
    };
    let holder = |label: &str| {
        let mut child = node
            .probe(Some(&limits))
            .env("TESSERA_SIM_CUDA_CONTEXT_MIB", "300")
            .args(["script", "retain 0", &format!("info {label}"), "wait"])
            .0
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        while !line.starts_with("state=waiting") {
            line.clear();
            assert!(out.read_line(&mut line).expect("read") > 0, "holder ended");
        }
        (child, out)
    };
    let mut holders = vec![holder("one"), holder("two")];
    // NVML (nvidia-smi, pynvml) shows the two contexts as the slice's use.
    let nvml = node
        .compile_c("nvml_memory", "nvml_dlsym", &[])
        .map(|program| node.command(&program, Some(&limits)).run());
    let third = node
        .probe(Some(&limits))
        .env("TESSERA_SIM_CUDA_CONTEXT_MIB", "300")
        .args([
            "script",
            "retain 0",
            "info mine",
            "alloc fits 100",
            "alloc more 200",
        ])
        .run();
    for (child, _) in &mut holders {
        let _ = child.kill();
        let _ = child.wait();
    }
    // Three contexts of 300 MiB in a 1024 MiB slice: 124 MiB left.
    assert_eq!(
        third.num("mine.free"),
        (SLICE_MIB - 900) * MIB,
        "{}",
        third.describe()
    );
    if let Some(nvml) = nvml {
        nvml.expect_success();
        assert_eq!(
            nvml.num("device.0.total"),
            SLICE_MIB * MIB,
            "{}",
            nvml.describe()
        );
        assert_eq!(
            nvml.num("device.0.used"),
            600 * MIB,
            "the two contexts: {}",
            nvml.describe()
        );
    }
    let results: Vec<String> = steps(&third).into_iter().map(|(_, rc)| rc).collect();
    assert_eq!(results[2], "CUDA_SUCCESS");
    assert_eq!(results[3], "CUDA_ERROR_OUT_OF_MEMORY");
}

// ---------------------------------------------------------------------------
// Property: N processes × M threads, random APIs, kills and new processes
// ---------------------------------------------------------------------------

/// Seconds of random stress (CI keeps it short; `TESSERA_STRESS_SECS` for a
/// long run).
fn stress_secs() -> u64 {
    std::env::var("TESSERA_STRESS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6)
}

#[test]
fn random_processes_threads_and_kills_never_exceed_the_slice() {
    let Some((node, limits)) = demo_with_1_gib() else {
        return;
    };
    let secs = stress_secs();
    let mut rng = 0x2545_F491_4F6C_DD1D_u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let pids = Watched::default();
    let ((started, killed), max_seen, readings, worst) = watching(&node, &pids, || {
        let deadline = Instant::now() + Duration::from_secs(secs);
        let mut seed = 100;
        let mut procs: Vec<Stresser> = Vec::new();
        let (mut started, mut killed) = (0u64, 0u64);
        while Instant::now() < deadline {
            procs.retain_mut(|p| p.child.try_wait().ok().flatten().is_none());
            while procs.len() < 4 {
                seed += 1;
                procs.push(Stresser::start(&node, &limits, seed, 3, 100_000, false));
                started += 1;
            }
            *pids.lock().expect("pids") = procs.iter().map(|p| p.child.id()).collect();
            std::thread::sleep(Duration::from_millis(50 + next() % 200));
            let victim = (next() % procs.len() as u64) as usize;
            let mut p = procs.swap_remove(victim);
            *pids.lock().expect("pids") = procs.iter().map(|p| p.child.id()).collect();
            let _ = p.child.kill();
            let _ = p.child.wait();
            killed += 1;
        }
        pids.lock().expect("pids").clear();
        drop(procs);
        (started, killed)
    });
    eprintln!(
        "stress: {secs} s, {started} processes started, {killed} killed mid-allocation, \
         {readings} snapshots of the GPU, at most {} MiB held of {SLICE_MIB} MiB",
        max_seen / MIB
    );
    assert!(killed >= 3 && readings > 10, "the stress ran");
    assert!(
        max_seen <= SLICE_MIB * MIB,
        "the GPU held {max_seen} bytes for the container: {worst}"
    );
    // Everything was killed: a fresh process finds the whole slice free.
    assert_the_whole_slice_is_free(&node, &limits);
}

#[test]
fn a_containerized_process_finds_itself_in_nvml_and_its_context_counts() {
    let Some((node, limits)) = node_as_root("pid namespaces (unshare --pid) need root") else {
        return;
    };
    // Its own pid namespace, the host's /proc: as in a container, NVML
    // lists the process under its host pid, which differs from getpid().
    let run = |limits: Option<&Path>| {
        let mut probe = node
            .command(Path::new("unshare"), None)
            .args(["--pid", "--fork", "--kill-child", "--"])
            .arg(&node.a.probe)
            .args([
                "script",
                "retain 0",
                "info mine",
                "alloc rest 724",
                "alloc more 1",
            ])
            .env("TESSERA_SIM_CUDA_CONTEXT_MIB", "300");
        if let Some(limits) = limits {
            probe = probe
                .env("LD_PRELOAD", &node.a.lib)
                .env("TESSERA_VGPU_CONFIG", limits);
        }
        probe.run()
    };
    expect_steps(&run(None), &["ok"; 4]);
    let out = run(Some(&limits));
    assert_eq!(
        out.num("mine.free"),
        (SLICE_MIB - 300) * MIB,
        "{}",
        out.describe()
    );
    expect_steps(&out, &["ok", "ok", "ok", "oom"]);
}
