//! Processes and mounts, read from `/proc`: which process is which (a pid
//! together with its start time, so a reused pid is never mistaken for a
//! service), who descends from whom, which leftovers belong to a cluster's
//! root, what is mounted below its nodes.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Program names (argv[0]'s file name) that a cluster runs and that a
/// sweep may kill when one of their arguments names a path below the root.
const SWEPT_PROGRAMS: [&str; 2] = ["tessera-sim", "containerd"];

/// Prefix of containerd's shims' program names (`containerd-shim-runc-v2`).
const SHIM_PREFIX: &str = "containerd-shim";

/// Pids of processes whose command line has `needle` as one whole argument
/// and whose program name (argv[0]'s file name) satisfies `program`.
pub fn processes_with_arg(needle: &str, program: impl Fn(&str) -> bool) -> Vec<i32> {
    all_pids()
        .into_iter()
        .filter(|pid| {
            let args = cmdline(*pid);
            args.first().is_some_and(|a| program(program_name(a)))
                && args.iter().skip(1).any(|arg| arg == needle)
        })
        .collect()
}

/// Whether `name` is a containerd shim's program name.
pub fn is_shim(name: &str) -> bool {
    name.starts_with(SHIM_PREFIX)
}

/// The file name of argv[0].
fn program_name(arg0: &str) -> &str {
    arg0.rsplit('/').next().unwrap_or(arg0)
}

/// A process's command line, one string per argument (empty when gone).
pub fn cmdline(pid: i32) -> Vec<String> {
    fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| {
            c.split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `path` names `dir` or something below it, comparing whole path
/// components (`/tmp/c/x` is below `/tmp/c`; `/tmp/c2` and `/var/tmp/c`
/// are not). Relative paths never are.
pub fn path_is_under(path: &str, dir: &Path) -> bool {
    let path = Path::new(path);
    path.is_absolute() && path.starts_with(dir)
}

/// Whether one of `args` (after argv[0]) is, or has as its `=` value, a path
/// at or below `dir`.
fn names_path_under(args: &[String], dir: &Path) -> bool {
    args.iter().skip(1).any(|arg| {
        path_is_under(arg, dir)
            || arg
                .split_once('=')
                .is_some_and(|(_, value)| path_is_under(value, dir))
    })
}

/// This process and its ancestors: never swept.
fn me_and_my_ancestors() -> Vec<i32> {
    let me = i32::try_from(std::process::id()).unwrap_or(-1);
    let mut out = vec![me];
    let mut pid = me;
    while let Some(parent) = parent_pid(pid).filter(|p| *p > 0) {
        out.push(parent);
        pid = parent;
    }
    out
}

/// Processes a cluster rooted at `root` may have left behind, and only
/// those: live processes (other than this one and its ancestors) whose
/// program is `tessera-sim`, `containerd` or a containerd shim with an
/// argument naming a path below `root` (never a `cluster down|status`).
/// A user's `kubectl --kubeconfig DIR/kubeconfig`, `tail -f DIR/logs/x.log`
/// or editor is not one of them. Containers' processes are their shims'
/// descendants (the kernel shows a container's `/proc/<pid>/root` as `/`,
/// so they cannot be told by their root).
pub fn leftovers_of(root: &Path) -> Vec<i32> {
    let spared = me_and_my_ancestors();
    all_pids()
        .into_iter()
        .filter(|pid| !spared.contains(pid))
        .filter(|pid| {
            let args = cmdline(*pid);
            let ours = args.first().is_some_and(|a| {
                let name = program_name(a);
                SWEPT_PROGRAMS.contains(&name) || is_shim(name)
            }) && names_path_under(&args, root);
            let control = args
                .windows(2)
                .any(|w| w[0] == "cluster" && (w[1] == "down" || w[1] == "status"));
            ours && !control
        })
        .filter(|pid| !is_zombie(*pid))
        .collect()
}

fn all_pids() -> Vec<i32> {
    fs::read_dir("/proc")
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// `roots` and all their descendants, parents before children.
pub fn with_descendants(roots: &[i32]) -> Vec<i32> {
    let mut children: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
    for pid in all_pids() {
        if let Some(ppid) = parent_pid(pid) {
            children.entry(ppid).or_default().push(pid);
        }
    }
    let mut out = Vec::new();
    let mut queue: Vec<i32> = roots.to_vec();
    while let Some(pid) = queue.pop() {
        if out.contains(&pid) {
            continue;
        }
        out.push(pid);
        if let Some(kids) = children.get(&pid) {
            queue.extend(kids);
        }
    }
    out
}

/// The fields of `/proc/<pid>/stat` after `(comm)`: field 3 (state) first.
fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    Some(after.split_whitespace().map(str::to_owned).collect())
}

/// The parent pid from `/proc/<pid>/stat` (field 4).
pub fn parent_pid(pid: i32) -> Option<i32> {
    stat_fields(pid)?.get(1)?.parse().ok()
}

/// The start time of `pid` (field 22 of `/proc/<pid>/stat`, clock ticks
/// since boot): with the pid, it names one process for good.
pub fn start_time(pid: i32) -> Option<u64> {
    stat_fields(pid)?.get(19)?.parse().ok()
}

fn is_zombie(pid: i32) -> bool {
    stat_fields(pid).is_some_and(|f| f.first().is_some_and(|s| s == "Z" || s == "X"))
}

/// Whether `pid` is a live process (not gone, not a zombie).
pub fn alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists() && !is_zombie(pid)
}

/// Whether the process recorded as (`pid`, `start`) is still that process
/// and alive: a pid whose start time differs is someone else's.
pub fn is_running(pid: u32, start: u64) -> bool {
    i32::try_from(pid).is_ok_and(|p| alive(p) && start_time(p) == Some(start))
}

/// Sends `sig` to `pid`, ignoring a process already gone.
pub fn signal(pid: i32, sig: rustix::process::Signal) {
    if let Some(pid) = rustix::process::Pid::from_raw(pid) {
        let _ = rustix::process::kill_process(pid, sig);
    }
}

/// Waits until none of `pids` is alive or `timeout` passes; whether they all went.
pub fn wait_gone(pids: &[i32], timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if !pids.iter().any(|p| alive(*p)) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Mount points (of this process's mount namespace) at or below `dir`.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(unescape_mount_point(m)))
        .filter(|m| m.starts_with(dir))
        .collect()
}

/// Mount points strictly below a node directory of the cluster rooted at
/// `root` (`root/nodes/<node>/…`): what containerd and the containers
/// mounted. Never the root, `root/nodes` or a node directory itself.
pub fn mounts_below_nodes(root: &Path) -> Vec<PathBuf> {
    mounts_under(&root.join("nodes"))
        .into_iter()
        .filter(|m| is_below_a_node(root, m))
        .collect()
}

/// Whether `path` is strictly below `root/nodes/<node>/`.
fn is_below_a_node(root: &Path, path: &Path) -> bool {
    path.strip_prefix(root.join("nodes"))
        .is_ok_and(|rest| rest.components().count() >= 2)
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape_mount_point(field: &str) -> String {
    field
        .replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// Unmounts (lazily, deepest first) the mount points `mounts`; what could
/// not be unmounted is logged.
pub fn unmount(mut mounts: Vec<PathBuf>) {
    mounts.sort_by_key(|m| std::cmp::Reverse(m.as_os_str().len()));
    for mount in mounts {
        let ok = Command::new("umount")
            .arg("-l")
            .arg(&mount)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            tracing::warn!(mount = %mount.display(), "could not unmount");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::CommandExt as _;

    use super::*;

    #[test]
    fn this_process_descends_from_its_parent_and_is_alive() {
        let me = i32::try_from(std::process::id()).expect("pid");
        let parent = parent_pid(me).expect("a parent");
        assert!(with_descendants(&[parent]).contains(&me));
        assert!(alive(me));
    }

    #[test]
    fn a_pid_is_trusted_only_with_its_own_start_time() {
        let me = std::process::id();
        let start = start_time(i32::try_from(me).expect("pid")).expect("start time");
        assert!(is_running(me, start));
        // The same pid with another start time: a reused pid, someone else.
        assert!(!is_running(me, start + 1));
        assert!(!is_running(me, start.saturating_sub(1)));
    }

    #[test]
    fn paths_are_compared_by_whole_components() {
        let dir = Path::new("/tmp/c");
        assert!(path_is_under("/tmp/c", dir));
        assert!(path_is_under("/tmp/c/nodes/node-1", dir));
        assert!(!path_is_under("/tmp/c2", dir));
        assert!(!path_is_under("/var/tmp/c/x", dir));
        assert!(!path_is_under("tmp/c/x", dir));
        let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert!(names_path_under(
            &args(&["x", "--config=/tmp/c/a.toml"]),
            dir
        ));
        assert!(!names_path_under(&args(&["/tmp/c/bin/x", "-v"]), dir));
        assert!(!names_path_under(
            &args(&["x", "--config=/var/tmp/c/a"]),
            dir
        ));
    }

    /// Spawns `sh` named `arg0` (so its argv[0] is that), with `args` after
    /// the script, and waits until its command line shows them.
    fn named_sleeper(arg0: &str, args: &[String]) -> std::process::Child {
        let child = Command::new("sh")
            .arg0(arg0)
            .arg("-c")
            .arg("sleep 30; :")
            .arg("sh")
            .args(args)
            .spawn()
            .expect("sh");
        let pid = i32::try_from(child.id()).expect("pid");
        let deadline = Instant::now() + Duration::from_secs(5);
        while cmdline(pid).first().map(String::as_str) != Some(arg0) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        child
    }

    #[test]
    fn leftovers_are_our_programs_naming_the_root_and_nobody_else() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("c");
        let sibling = dir.path().join("c2");
        let under = |p: &Path, rest: &str| p.join(rest).display().to_string();
        let socket = under(&root, "nodes/node-1/containerd/containerd.sock");
        let mut shim = named_sleeper(
            "/opt/x/containerd-shim-runc-v2",
            &["-address".into(), socket.clone()],
        );
        let mut daemon = named_sleeper(
            "containerd",
            &[format!("--config={}", under(&root, "nodes/node-1/c.toml"))],
        );
        // A user's tools naming the root, and our programs naming a sibling.
        let mut tail = named_sleeper("tail", &["-f".into(), under(&root, "logs/x.log")]);
        let mut kubectl = named_sleeper(
            "kubectl",
            &["--kubeconfig".into(), under(&root, "kubeconfig")],
        );
        let mut other = named_sleeper("tessera-sim", &["--root".into(), under(&sibling, "")]);
        let mut control = named_sleeper(
            "tessera-sim",
            &[
                "cluster".into(),
                "down".into(),
                "--root".into(),
                under(&root, ""),
            ],
        );
        let pid = |c: &std::process::Child| i32::try_from(c.id()).expect("pid");
        let mut found = leftovers_of(&root);
        found.sort_unstable();
        let mut want = vec![pid(&shim), pid(&daemon)];
        want.sort_unstable();
        assert_eq!(found, want);
        assert_eq!(
            processes_with_arg(&socket, is_shim),
            vec![pid(&shim)],
            "the shim, by its socket"
        );
        assert!(processes_with_arg(&socket, |n| n == "containerd").is_empty());
        for c in [
            &mut shim,
            &mut daemon,
            &mut tail,
            &mut kubectl,
            &mut other,
            &mut control,
        ] {
            let _ = c.kill();
            let _ = c.wait();
        }
        assert!(leftovers_of(&root).is_empty());
    }

    #[test]
    fn only_mounts_strictly_below_a_node_directory_are_ours() {
        let root = Path::new("/tmp/c");
        for (path, ours) in [
            ("/tmp/c", false),
            ("/tmp/c/nodes", false),
            ("/tmp/c/nodes/node-1", false),
            ("/tmp/c/nodes/node-1/containerd/state/x/rootfs", true),
            ("/tmp/c/logs/x", false),
            ("/tmp/c2/nodes/node-1/x", false),
            ("/", false),
        ] {
            assert_eq!(is_below_a_node(root, Path::new(path)), ours, "{path}");
        }
        // `/` as a root claims nothing outside `/nodes/<node>/…`.
        assert!(
            mounts_below_nodes(Path::new("/"))
                .iter()
                .all(|m| m.starts_with("/nodes"))
        );
    }

    #[test]
    fn mount_points_are_unescaped() {
        assert_eq!(unescape_mount_point("/a\\040b\\134c"), "/a b\\c");
    }
}
