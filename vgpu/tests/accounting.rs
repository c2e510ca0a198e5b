//! Shared accounting across real processes: one budget for two processes ×
//! four threads, usage of `kill -9`ed processes reclaimed (in any pid
//! namespace, whatever their pid number), no underflow, foreign or
//! other-version files refused and left intact, forked children charging
//! into slots of their own and never keeping their parent's slot alive, and
//! nothing stalled by a process that holds a lock on the file.
//!
//! Child processes are this test binary itself, started with
//! `TESSERA_ACCOUNTING_TEST_ROLE` set; `child_process_role` is their body and
//! does nothing in a normal run.

mod common;

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tessera_vgpu::accounting::{
    AccountingError, LAYOUT_VERSION, MAGIC, SharedRegion, create_file, layout,
};

const ROLE: &str = "TESSERA_ACCOUNTING_TEST_ROLE";
const REGION: &str = "TESSERA_ACCOUNTING_TEST_REGION";
const AMOUNT: &str = "TESSERA_ACCOUNTING_TEST_AMOUNT";

const LIMIT: u64 = 64 << 20;
const CHUNK: u64 = 64 << 10;
const THREADS: usize = 4;
const CHURN: usize = 100_000;

// ---------------------------------------------------------------------------
// Child side
// ---------------------------------------------------------------------------

/// The body of the child processes, run only by the tests below (each in a
/// process of its own, with `--ignored`).
#[test]
#[ignore = "run as a child process by the tests of this file"]
fn child_process_role() {
    let role = std::env::var(ROLE).expect("started by a test of this file, with a role");
    let path = PathBuf::from(std::env::var(REGION).expect("region path"));
    let amount: u64 = std::env::var(AMOUNT)
        .ok()
        .and_then(|a| a.parse().ok())
        .unwrap_or(0);
    let region = SharedRegion::open(&path, 1).expect("child opens the region");
    let mut stdin = std::io::stdin().lock();
    let mut line = String::new();
    match role.as_str() {
        "fill" => {
            say("ready");
            stdin.read_line(&mut line).expect("go");
            let granted = churn_then_fill(&region);
            say(&format!("granted {granted}"));
            line.clear();
            stdin.read_line(&mut line).expect("release");
            region.uncharge(0, granted);
            say("released");
        }
        "hold" => {
            assert!(region.try_charge(0, amount, u64::MAX), "hold charge");
            say("held");
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        "fork-then-hold" => {
            assert!(region.try_charge(0, amount, u64::MAX), "hold charge");
            // SAFETY: the child only sleeps (and is killed by the test).
            let grandchild = unsafe { libc::fork() };
            assert!(grandchild >= 0, "fork");
            if grandchild == 0 {
                loop {
                    // SAFETY: sleeps; async-signal-safe after fork.
                    unsafe { libc::pause() };
                }
            }
            say(&format!("forked {grandchild}"));
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        "open" => {
            say("opened");
            // Stay registered until the parent closes our stdin.
            let _ = stdin.read_line(&mut line);
        }
        other => panic!("unknown role {other}"),
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "@@ {line}").expect("stdout");
    out.flush().expect("flush");
}

/// Four threads charge and uncharge CHUNKs at random for a while, then each
/// fills until refused; returns what this process holds at the end.
fn churn_then_fill(region: &SharedRegion) -> u64 {
    let held = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let held = &held;
            s.spawn(move || {
                let mut rng = 0x9E37_79B9_7F4A_7C15_u64
                    ^ ((t as u64 + 1) << 32)
                    ^ u64::from(std::process::id());
                let mut mine = 0u64;
                for _ in 0..CHURN {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    if !rng.is_multiple_of(3) {
                        if region.try_charge(0, CHUNK, LIMIT) {
                            mine += CHUNK;
                        }
                    } else if mine > 0 {
                        region.uncharge(0, CHUNK);
                        mine -= CHUNK;
                    }
                }
                while region.try_charge(0, CHUNK, LIMIT) {
                    mine += CHUNK;
                }
                held.fetch_add(mine, Ordering::Relaxed);
            });
        }
    });
    held.into_inner()
}

// ---------------------------------------------------------------------------
// Parent side
// ---------------------------------------------------------------------------

struct ChildProc {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl ChildProc {
    /// This test binary as a child in `role`, on the region at `region`.
    fn spawn(role: &str, region: &Path, amount: u64) -> ChildProc {
        let cmd = Command::new(std::env::current_exe().expect("test binary"));
        ChildProc::spawn_by(cmd, role, region, amount)
    }

    /// [`ChildProc::spawn`] with `cmd` running the test binary (the
    /// binary itself, or a program whose last argument so far is its path).
    fn spawn_by(mut cmd: Command, role: &str, region: &Path, amount: u64) -> ChildProc {
        let mut child = cmd
            .args([
                "--ignored",
                "--exact",
                "child_process_role",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ROLE, role)
            .env(REGION, region)
            .env(AMOUNT, amount.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn child");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        ChildProc {
            child,
            stdin,
            stdout,
        }
    }

    /// The next line the child said (skipping the test harness's own output).
    fn expect(&mut self, prefix: &str) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.stdout.read_line(&mut line).expect("read child");
            assert!(n > 0, "child exited before saying {prefix:?}");
            // libtest may have printed "test child_process_role ... " first.
            if let Some((_, said)) = line.trim_end().split_once("@@ ") {
                assert!(
                    said.starts_with(prefix),
                    "child said {said:?}, expected {prefix:?}"
                );
                return said[prefix.len()..].trim().to_string();
            }
        }
    }

    fn tell(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{line}").expect("write child");
        stdin.flush().expect("flush child");
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn kill(&mut self) {
        self.child.kill().expect("SIGKILL");
    }

    fn wait(mut self) -> std::process::ExitStatus {
        drop(self.stdin.take());
        self.child.wait().expect("wait")
    }
}

impl Drop for ChildProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An empty region file, as the node side creates it.
fn region_path(dir: &tempfile::TempDir) -> PathBuf {
    let path = dir.path().join("vgpu.accounting");
    create_file(&path).expect("region file");
    path
}

/// A fresh region file (in a directory removed on drop), its path, and
/// this process's handle on it (one device).
fn fresh_region() -> (tempfile::TempDir, PathBuf, SharedRegion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = region_path(&dir);
    let region = SharedRegion::open(&path, 1).expect("open");
    (dir, path, region)
}

/// Calls `reclaim_dead` until it has returned `expected` bytes in all (a
/// killed process takes a moment to die).
fn reclaim_until(region: &SharedRegion, expected: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut total = 0;
    while total < expected && Instant::now() < deadline {
        total += region.reclaim_dead();
        if total < expected {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    total
}

#[test]
fn two_processes_share_one_budget_and_never_exceed_it() {
    let (_dir, path, region) = fresh_region();
    let mut child = ChildProc::spawn("fill", &path, 0);
    child.expect("ready");

    let done = AtomicBool::new(false);
    let (mine, observations) = std::thread::scope(|s| {
        let watcher = s.spawn(|| {
            let mut seen = 0u64;
            while !done.load(Ordering::Relaxed) {
                let used = region.used(0);
                assert!(used <= LIMIT, "total {used} exceeds the limit {LIMIT}");
                seen += 1;
            }
            seen
        });
        child.tell("go");
        let mine = churn_then_fill(&region);
        let theirs: u64 = child.expect("granted").parse().expect("number");
        done.store(true, Ordering::Relaxed);
        let observations = watcher.join().expect("watcher");
        assert_eq!(
            mine + theirs,
            LIMIT,
            "both processes together hold exactly the limit (no lost or phantom update)"
        );
        (mine, observations)
    });
    assert!(observations > 0);
    assert_eq!(region.used(0), LIMIT);
    assert_eq!(region.process_used(0), mine);

    child.tell("release");
    child.expect("released");
    assert!(child.wait().success());
    region.uncharge(0, mine);
    assert_eq!(region.used(0), 0);
}

#[test]
fn usage_of_killed_processes_is_reclaimed() {
    let (_dir, path, region) = fresh_region();
    assert!(region.try_charge(0, 1000, u64::MAX));

    let mut reaped = ChildProc::spawn("hold", &path, 3 << 20);
    reaped.expect("held");
    let mut zombie = ChildProc::spawn("hold", &path, 5 << 20);
    zombie.expect("held");
    assert_eq!(region.used(0), 1000 + (8 << 20));
    assert_eq!(region.reclaim_dead(), 0, "nobody is dead yet");

    reaped.kill();
    reaped.child.wait().expect("reap");
    // Killed but not reaped: a zombie, whose GPU memory is gone all the same.
    zombie.kill();

    assert_eq!(reclaim_until(&region, 8 << 20), 8 << 20);
    assert_eq!(region.used(0), 1000, "the live process keeps its usage");
    assert_eq!(region.reclaim_dead(), 0, "reclaimed once only");
}

#[test]
fn uncharging_more_than_charged_cannot_underflow_or_erase_others() {
    let (_dir, path, region) = fresh_region();
    let mut other = ChildProc::spawn("hold", &path, 1000);
    other.expect("held");

    assert!(region.try_charge(0, 100, u64::MAX));
    region.uncharge(0, 150);
    assert_eq!(region.process_used(0), 0);
    assert_eq!(region.used(0), 1000, "the other process's usage is intact");
    region.uncharge(0, u64::MAX);
    assert_eq!(region.used(0), 1000);

    other.kill();
    assert_eq!(reclaim_until(&region, 1000), 1000);
    assert_eq!(region.used(0), 0);
    region.uncharge(0, 1);
    assert_eq!(region.used(0), 0, "no wrap below zero");
}

/// Writes a slot claiming `pid` with `start_time`, holding `bytes` on device 0.
fn forge_slot(path: &Path, pid: u32, start_time: u64, bytes: u64) {
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .expect("open region file");
    let slot = (0..1024)
        .map(|i| layout::SLOTS + i * layout::SLOT_SIZE)
        .find(|&at| {
            let mut pid = [0u8; 4];
            file.read_exact_at(&mut pid, (at + layout::SLOT_PID) as u64)
                .expect("read");
            u32::from_le_bytes(pid) == 0
        })
        .expect("a free slot");
    let mut total = [0u8; 8];
    let total_at = (layout::DEVICES + layout::DEVICE_USED) as u64;
    file.read_exact_at(&mut total, total_at).expect("read");
    let total = u64::from_le_bytes(total) + bytes;
    file.write_all_at(&total.to_le_bytes(), total_at)
        .expect("write");
    file.write_all_at(&bytes.to_le_bytes(), (slot + layout::SLOT_USED) as u64)
        .expect("write");
    file.write_all_at(
        &start_time.to_le_bytes(),
        (slot + layout::SLOT_START_TIME) as u64,
    )
    .expect("write");
    file.write_all_at(&pid.to_le_bytes(), (slot + layout::SLOT_PID) as u64)
        .expect("write");
}

fn start_time_of(pid: u32) -> u64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let after = &stat[stat.rfind(')').expect("comm") + 1..];
    after
        .split_whitespace()
        .nth(19)
        .expect("field 22")
        .parse()
        .expect("number")
}

#[test]
fn a_slot_is_alive_while_its_lock_is_held_whatever_its_pid_says() {
    let (_dir, path, region) = fresh_region();
    // A live process that registered and holds 300 bytes ...
    let mut live = ChildProc::spawn("hold", &path, 300);
    live.expect("held");
    // ... and a slot naming that same live pid and start time that nobody
    // holds: a process of another pid namespace that had the same number
    // and died holding 500 bytes. Pid numbers decide nothing.
    let pid = live.pid();
    forge_slot(&path, pid, start_time_of(pid), 500);
    assert_eq!(region.used(0), 800);
    assert_eq!(region.reclaim_dead(), 500, "only the unheld slot");
    assert_eq!(region.used(0), 300);
    live.kill();
    assert_eq!(reclaim_until(&region, 300), 300, "then the killed one");
    assert_eq!(region.used(0), 0);
}

/// Whether this process may make pid namespaces (root, `unshare` present).
fn can_unshare_pid() -> Result<(), String> {
    let out = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .output()
        .map_err(|e| format!("unshare: {e}; apt-get install util-linux"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "unshare --pid does not work here ({}); run as root",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

#[test]
fn a_process_killed_in_another_pid_namespace_gives_its_memory_back() {
    let works = can_unshare_pid();
    let Ok(()) = common::require(&[common::Need::condition(
        works.is_ok(),
        format!(
            "pid namespaces: {}",
            works.as_ref().err().map_or("", String::as_str)
        ),
        "run as root with util-linux installed",
    )]) else {
        return;
    };
    let (_dir, path, region) = fresh_region();
    // A container: its own pid namespace, where the holder is pid 2 or so
    // (numbers that mean another process, or none, out here).
    let mut unshare = Command::new("unshare");
    unshare
        .args(["--pid", "--fork", "--kill-child", "--mount-proc"])
        .arg(std::env::current_exe().expect("test binary"));
    let mut container = ChildProc::spawn_by(unshare, "hold", &path, 7 << 20);
    container.expect("held");
    assert_eq!(region.used(0), 7 << 20);
    assert_eq!(region.reclaim_dead(), 0, "alive in its namespace");
    // The container crashes: unshare is killed, and --kill-child takes the holder.
    container.kill();
    container.child.wait().expect("wait");
    assert_eq!(reclaim_until(&region, 7 << 20), 7 << 20);
    assert_eq!(
        region.used(0),
        0,
        "the restarted container finds its slice free"
    );
}

#[test]
fn a_lock_held_on_the_file_by_any_reader_stalls_nothing() {
    let (_dir, path, first) = fresh_region();
    // Any process that can read the file can flock it, or lock byte ranges.
    let reader = fs::File::open(&path).expect("read-only open");
    // SAFETY: flock on a descriptor we own.
    assert_eq!(unsafe { libc::flock(reader.as_raw_fd(), libc::LOCK_EX) }, 0);
    let started = Instant::now();
    let second = SharedRegion::open(&path, 1).expect("open while flocked");
    assert!(second.has_slot());
    assert!(second.try_charge(0, 10, 100));
    assert!(first.try_charge(0, 90, 100));
    assert!(!second.try_charge(0, 1, 100), "still one budget");
    assert!(
        started.elapsed() < Duration::from_millis(100),
        "no waiting: {:?}",
        started.elapsed()
    );
}

#[test]
fn a_parent_killed_while_its_forked_child_lives_gives_its_memory_back() {
    let (_dir, path, region) = fresh_region();
    let mut parent = ChildProc::spawn("fork-then-hold", &path, 4096);
    let grandchild: i32 = parent.expect("forked").parse().expect("pid");
    assert_eq!(region.used(0), 4096);
    parent.kill();
    let reclaimed = reclaim_until(&region, 4096);
    // SAFETY: signals the grandchild the test made; it only sleeps.
    unsafe { libc::kill(grandchild, libc::SIGKILL) };
    assert_eq!(
        reclaimed, 4096,
        "the forked child's inherited descriptor does not keep the parent's slot"
    );
}

#[test]
fn files_that_are_not_this_layout_are_refused_and_left_intact() {
    let dir = tempfile::tempdir().expect("temp dir");

    // Another program's file at the path.
    let foreign = dir.path().join("foreign");
    let text = b"HAMi shared region or anything else".repeat(100);
    fs::write(&foreign, &text).expect("write");
    let err = SharedRegion::open(&foreign, 1).expect_err("refused");
    assert!(matches!(err, AccountingError::NotOurs { .. }), "{err}");
    assert_eq!(fs::read(&foreign).expect("read"), text, "never written");

    // A region of another layout version.
    let newer = dir.path().join("newer");
    let mut bytes = vec![0u8; layout::SIZE];
    bytes[..8].copy_from_slice(&MAGIC.to_le_bytes());
    bytes[layout::VERSION..layout::VERSION + 4]
        .copy_from_slice(&(LAYOUT_VERSION + 1).to_le_bytes());
    bytes[layout::SLOTS] = 0xAB;
    fs::write(&newer, &bytes).expect("write");
    let err = SharedRegion::open(&newer, 1).expect_err("refused");
    assert!(
        matches!(err, AccountingError::VersionMismatch { found, .. } if found == LAYOUT_VERSION + 1),
        "{err}"
    );
    assert_eq!(fs::read(&newer).expect("read"), bytes, "never written");

    // This version's header on a file of another size.
    let resized = dir.path().join("resized");
    let mut bytes = vec![0u8; layout::SIZE + 4096];
    bytes[..8].copy_from_slice(&MAGIC.to_le_bytes());
    bytes[layout::VERSION..layout::VERSION + 4].copy_from_slice(&LAYOUT_VERSION.to_le_bytes());
    bytes[layout::LAYOUT_SIZE..layout::LAYOUT_SIZE + 8]
        .copy_from_slice(&(layout::SIZE as u64).to_le_bytes());
    fs::write(&resized, &bytes).expect("write");
    let err = SharedRegion::open(&resized, 1).expect_err("refused");
    assert!(
        matches!(err, AccountingError::LayoutMismatch { .. }),
        "{err}"
    );
    assert_eq!(fs::read(&resized).expect("read"), bytes, "never written");

    // A symlink is not followed, so it cannot point the region at another file.
    let target = dir.path().join("target");
    fs::write(&target, b"precious").expect("write");
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    assert!(SharedRegion::open(&link, 1).is_err());
    assert_eq!(fs::read(&target).expect("read"), b"precious");

    // Too many devices.
    let many = dir.path().join("many");
    create_file(&many).expect("create");
    let err = SharedRegion::open(&many, 17).expect_err("refused");
    assert!(
        matches!(err, AccountingError::TooManyDevices { .. }),
        "{err}"
    );

    // An interrupted creation (zeros only) is completed, not refused.
    let partial = dir.path().join("partial");
    fs::write(&partial, vec![0u8; 4096]).expect("write");
    let region = SharedRegion::open(&partial, 1).expect("zero-filled leftover is initialized");
    assert!(region.try_charge(0, 1, 1));
    assert_eq!(
        fs::metadata(&partial).expect("stat").len(),
        layout::SIZE as u64
    );
}

#[test]
fn processes_racing_to_initialize_the_region_all_join_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = region_path(&dir);
    let mut children: Vec<ChildProc> = (0..6).map(|_| ChildProc::spawn("open", &path, 0)).collect();
    for child in &mut children {
        child.expect("opened");
    }
    let region = SharedRegion::open(&path, 1).expect("open");
    assert_eq!(region.registered_processes(), 7);
    assert_eq!(
        fs::metadata(&path).expect("stat").len(),
        layout::SIZE as u64
    );
    for child in children {
        assert!(child.wait().success());
    }
    assert_eq!(
        region.registered_processes(),
        1,
        "children gave their empty slots back"
    );
}

#[test]
fn a_forked_child_charges_into_a_slot_of_its_own() {
    let (_dir, _, region) = fresh_region();
    assert!(region.try_charge(0, 100, u64::MAX));

    // SAFETY: the child only uses the region (atomics, file syscalls, small
    // allocations, which glibc permits after fork) and leaves with `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let ok = region.process_used(0) == 0 && region.try_charge(0, 200, u64::MAX);
        // Exit holding the 200 bytes, as a crashing child would.
        // SAFETY: ends the child without running the harness's teardown.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waits for the child just forked; `status` is a valid out-pointer.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child failed"
    );

    assert_eq!(region.used(0), 300);
    assert_eq!(
        region.process_used(0),
        100,
        "the parent's slot has only its own usage"
    );
    assert_eq!(region.reclaim_dead(), 200, "the child's usage died with it");
    assert_eq!(region.used(0), 100);
}
