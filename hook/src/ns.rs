//! Finding the container's init process, entering its mount namespace, and
//! opening its root directory there.
//!
//! [`locate`] reads the facts — the hook's own process, its parent, the
//! candidate, `config.json` — and [`crate::identity`] decides from them; the
//! table of what runc and crun pass at each stage is there. The candidate's
//! `/proc/<pid>` directory is opened once and every later read goes through
//! that fd, so a pid reused meanwhile cannot be mistaken for the init.
//!
//! The container root is found in the container's mount namespace: when the
//! init has not pivoted yet (its `/proc/<pid>/root` is the same directory as the
//! host's `/`), it is the bundle's rootfs path, which must be a mount root
//! there (the runtime's bind mount); once pivoted, it is `/proc/<pid>/root`,
//! opened from the host before entering. Inside the container after the pivot
//! the hook refuses to inject: host paths would resolve in the container.
//!
//! `setns` needs a single-threaded process: the hook never starts a thread.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{CWD, Mode, OFlags, ResolveFlags, StatxAttributes, StatxFlags};
use rustix::thread::LinkNameSpaceType;

use crate::error::{HookError, Result};
use crate::fsutil::{fstat, same_inode};
use crate::identity::{self, CandidateView, Expected, NotProven, NsRequest, ProcFacts};
use crate::oci::{Bundle, OciConfig};
use crate::procfs::{CgroupEntry, NsId, ProcessDir, Procfs, parse_cgroup, parse_mountinfo};
use crate::rootfs::ContainerRoot;
use crate::state::State;

/// The container's init process, proven to be it (see [`crate::identity`]).
#[derive(Debug)]
pub struct Container {
    /// The init's pid in the host's pid namespace (as `/proc` numbers it).
    pub init_pid: u32,
    /// The hook runs in the container's mount namespace (a `createContainer` hook).
    pub inside: bool,
    /// The init's mount namespace, as the proof saw it.
    pub mnt: NsId,
    /// `/proc/<init>`, pinned.
    pub proc: ProcessDir,
    /// The init's cgroups, read while proving it.
    pub cgroups: Vec<CgroupEntry>,
    /// Whether those paths are seen from the runtime's cgroup namespace
    /// (false: from the container's own, where they are relative to it).
    pub cgroups_absolute: bool,
}

/// The most `config.json` mounts looked for under the rootfs.
const MAX_MOUNTS_CHECKED: usize = 64;

/// Finds the container's init process and proves it is this container's.
pub fn locate(
    procfs: &Procfs,
    state: &State,
    bundle: &Bundle,
    oci: &OciConfig,
) -> Result<Container> {
    let me = procfs
        .process("self")
        .map_err(|e| HookError::apply("opening /proc/self", e))?;
    let hook = facts_of(&me)?;
    let parent_dir = open_process(procfs, hook.ppid, "the hook's parent")?;
    let parent = facts_of(&parent_dir)?;
    let pid = identity::candidate(&hook, &parent, state.pid()).map_err(not_proven)?;
    let cand_dir = if pid == parent.pid {
        parent_dir
    } else {
        open_process(procfs, pid, "the OCI state's pid")?
    };
    let facts = facts_of(&cand_dir)?;
    let inside = facts.mnt == hook.mnt;
    let cgroups_absolute = see_cgroups_from_the_runtime(procfs, &me, &facts, inside, oci)?;
    let read = |rel: &str| {
        cand_dir
            .read(rel)
            .map_err(|e| HookError::apply(format!("reading /proc/{}/{rel}", cand_dir.label()), e))
    };
    let view = CandidateView {
        mounts: parse_mountinfo(&read("mountinfo")?),
        cgroups: parse_cgroup(&read("cgroup")?),
        facts,
        cgroups_absolute,
    };
    let expected = expected(bundle, oci)?;
    // runc's init is the runtime's child: no walk up needed.
    let ancestors = if inside || view.facts.ppid == parent.pid {
        Vec::new()
    } else {
        ancestors(procfs, &parent)
    };
    let proven = identity::prove(&hook, &parent, &ancestors, &view, &expected).map_err(|e| {
        match (state.pid(), e) {
            // crun's createContainer state has no pid; elsewhere a pid is required.
            (None, NotProven::Refused(why)) => HookError::State(format!(
                "no pid, and the hook's parent is no container init ({why}); run `tessera-hook prestart` as a prestart, createRuntime or createContainer hook"
            )),
            (_, e) => not_proven(e),
        }
    })?;
    crate::debug!(
        "container {}: init is host pid {} ({} its mount namespace)",
        state.id,
        proven.init_pid,
        if proven.inside {
            "hook in"
        } else {
            "hook outside"
        }
    );
    Ok(Container {
        init_pid: proven.init_pid,
        inside: proven.inside,
        mnt: view.facts.mnt,
        proc: cand_dir,
        cgroups: view.cgroups,
        cgroups_absolute,
    })
}

/// The most processes walked up from the runtime.
const MAX_ANCESTORS: usize = 64;

/// `runtime`'s pid and those of the processes above it, up to pid 1 (or as
/// far as `/proc` can be read).
fn ancestors(procfs: &Procfs, runtime: &ProcFacts) -> Vec<u32> {
    let mut chain = vec![runtime.pid];
    let mut next = runtime.ppid;
    while next != 0 && chain.len() < MAX_ANCESTORS && !chain.contains(&next) {
        chain.push(next);
        if next == 1 {
            break;
        }
        match procfs.process(&next.to_string()).and_then(|p| p.status()) {
            Ok(status) => next = status.ppid,
            Err(_) => break,
        }
    }
    chain
}

fn not_proven(e: NotProven) -> HookError {
    match e {
        NotProven::Refused(why) => HookError::Refused(why),
        NotProven::Unsupported(why) => HookError::Unsupported(why),
    }
}

fn open_process(procfs: &Procfs, pid: u32, what: &str) -> Result<ProcessDir> {
    procfs.process(&pid.to_string()).map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            HookError::Refused(format!("{what}, pid {pid}, does not exist"))
        } else {
            HookError::apply(format!("opening /proc/{pid} ({what})"), e)
        }
    })
}

fn facts_of(dir: &ProcessDir) -> Result<ProcFacts> {
    let err = |what: &str, e: io::Error| {
        HookError::apply(format!("reading /proc/{}/{what}", dir.label()), e)
    };
    let status = dir.status().map_err(|e| err("status", e))?;
    Ok(ProcFacts {
        pid: status.pid,
        ppid: status.ppid,
        nspid: status.nspid,
        mnt: dir.ns_id("mnt").map_err(|e| err("ns/mnt", e))?,
        pid_ns: dir.ns_id("pid").map_err(|e| err("ns/pid", e))?,
    })
}

/// A `createContainer` hook of a container with its own cgroup namespace is
/// in that namespace, where every cgroup path reads `/`. It moves into the
/// cgroup namespace of the process that started the init (the runtime, or
/// its parent) so the binding names the real cgroup; where that process
/// cannot be read, the paths stay relative and are not used as evidence.
fn see_cgroups_from_the_runtime(
    procfs: &Procfs,
    me: &ProcessDir,
    init: &ProcFacts,
    inside: bool,
    oci: &OciConfig,
) -> Result<bool> {
    if !inside || !oci.has_namespace("cgroup") {
        return Ok(true);
    }
    let Ok(starter) = procfs.process(&init.ppid.to_string()) else {
        return Ok(false);
    };
    let (Ok(own), Ok(theirs)) = (me.ns_id("cgroup"), starter.ns_id("cgroup")) else {
        return Ok(false);
    };
    if own == theirs {
        return Ok(true);
    }
    let Ok(target) = starter.open_link("ns/cgroup", OFlags::RDONLY) else {
        return Ok(false);
    };
    rustix::thread::move_into_link_name_space(
        target.as_fd(),
        Some(LinkNameSpaceType::ControlGroup),
    )
    .map_err(|e| {
        HookError::apply(
            "entering the runtime's cgroup namespace",
            std::io::Error::from(e),
        )
    })?;
    Ok(true)
}

/// What `config.json` says the container looks like.
fn expected(bundle: &Bundle, oci: &OciConfig) -> Result<Expected> {
    let request = |kind: &str| -> Result<NsRequest> {
        Ok(match oci.namespace(kind) {
            None => NsRequest::Shared,
            Some(ns) => match ns.path.as_deref().filter(|p| !p.is_empty()) {
                None => NsRequest::New,
                Some(path) => {
                    let st = rustix::fs::stat(path).map_err(|e| {
                        HookError::input(
                            format!("{}/config.json", bundle.path),
                            format!("linux.namespaces {kind} path {path}: {e}"),
                        )
                    })?;
                    NsRequest::Join(NsId::from_stat(&st))
                }
            },
        })
    };
    let rootfs = bundle.rootfs(oci).ok_or_else(|| {
        HookError::Unsupported(
            "config.json has no root.path; cannot find the container's root filesystem".into(),
        )
    })?;
    let rootfs = std::fs::canonicalize(&rootfs)
        .map_err(|e| HookError::apply(format!("resolving the rootfs {rootfs}"), e))?
        .to_str()
        .ok_or_else(|| HookError::Unsupported(format!("the rootfs {rootfs} is not UTF-8")))?
        .to_owned();
    let under = |dest: &str| {
        let dest = dest.trim_matches('/');
        if dest.is_empty() {
            rootfs.clone()
        } else {
            format!("{}/{dest}", rootfs.trim_end_matches('/'))
        }
    };
    Ok(Expected {
        mount: request("mount")?,
        pid: request("pid")?,
        mounts_under_rootfs: oci
            .mounts
            .iter()
            .filter(|m| m.destination.starts_with('/') && m.destination != "/")
            .take(MAX_MOUNTS_CHECKED)
            .map(|m| under(&m.destination))
            .collect(),
        rootfs,
        cgroups_path: oci.cgroups_path().map(str::to_owned),
    })
}

/// What must be taken from the host side before entering the container's
/// mount namespace to find its root afterwards.
#[derive(Debug)]
pub struct RootProbe {
    init_root: OwnedFd,
    pivoted: bool,
}

impl RootProbe {
    /// Opens `/proc/<init>/root` and compares it with the hook's own `/`.
    pub fn take(container: &Container) -> Result<RootProbe> {
        let err = |e: std::io::Error| {
            HookError::apply(format!("opening /proc/{}/root", container.init_pid), e)
        };
        let init_root = container
            .proc
            .open_link("root", OFlags::PATH | OFlags::DIRECTORY)
            .map_err(err)?;
        let own_root = rustix::fs::open(
            "/",
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| err(e.into()))?;
        let pivoted = !same_inode(
            &fstat(&init_root).map_err(err)?,
            &fstat(&own_root).map_err(err)?,
        );
        Ok(RootProbe { init_root, pivoted })
    }

    /// Opens the container root; call in the container's mount namespace.
    /// `rootfs` is the bundle's rootfs path (host path, as the runtime mounted it).
    /// `procfs` is the hook's checked `/proc`, kept for the root's writes.
    pub fn open(
        self,
        container: &Container,
        rootfs: Option<&str>,
        procfs: &Procfs,
    ) -> Result<ContainerRoot> {
        let wrap = |fd: OwnedFd| {
            ContainerRoot::with_procfs(fd, procfs)
                .map_err(|e| HookError::apply("duplicating the /proc fd", e))
        };
        if self.pivoted && !container.inside {
            return wrap(self.init_root);
        }
        let rootfs = rootfs.ok_or_else(|| {
            HookError::Unsupported(
                "config.json has no root.path; cannot find the container's root filesystem".into(),
            )
        })?;
        let fd = rustix::fs::openat2(
            CWD,
            rootfs,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::NO_MAGICLINKS,
        )
        .map_err(|e| {
            HookError::apply(
                format!("opening the rootfs {rootfs} in the container's mount namespace"),
                e,
            )
        })?;
        let stx = rustix::fs::statx(
            &fd,
            "",
            rustix::fs::AtFlags::EMPTY_PATH,
            StatxFlags::BASIC_STATS,
        )
        .map_err(|e| HookError::apply(format!("statx of {rootfs}"), e))?;
        let mount_root = stx
            .stx_attributes_mask
            .contains(StatxAttributes::MOUNT_ROOT)
            && stx.stx_attributes.contains(StatxAttributes::MOUNT_ROOT);
        let is_own_root = same_inode(
            &fstat(&fd).map_err(|e| HookError::apply(format!("fstat of {rootfs}"), e))?,
            &fstat(&self.init_root).map_err(|e| HookError::apply("fstat of the init's root", e))?,
        );
        if !mount_root || is_own_root {
            return Err(HookError::Unsupported(if container.inside {
                format!(
                    "tessera-hook runs inside the container after its root was switched ({rootfs} is not the runtime's rootfs mount); register it as a prestart or createRuntime hook for legacy injection"
                )
            } else {
                format!(
                    "{rootfs} is not a mount in the container's mount namespace; the runtime did not set up the rootfs as runc and crun do"
                )
            }));
        }
        wrap(fd)
    }
}

/// The hook inside the container's mount namespace; [`Entered::leave`] goes back.
#[derive(Debug)]
pub struct Entered {
    host: Option<OwnedFd>,
}

/// Enters the init's mount namespace unless the hook is already in it.
///
/// The target is opened through the init's pinned `/proc/<pid>` fd and must
/// be the namespace the proof saw ([`Container::mnt`]) and not the hook's own
/// (the host's, for a host-side hook); after the switch the hook must be in it.
pub fn enter(procfs: &Procfs, container: &Container) -> Result<Entered> {
    let pid = container.init_pid;
    let err = |what: &str, e: std::io::Error| {
        HookError::apply(format!("{what} (container init {pid})"), e)
    };
    let changed = || {
        HookError::Refused(
            "the container's mount namespace changed while the hook ran; nothing was injected"
                .into(),
        )
    };
    let me = procfs
        .process("self")
        .map_err(|e| err("opening /proc/self", e))?;
    let own_mnt = || {
        me.ns_id("mnt")
            .map_err(|e| err("reading /proc/self/ns/mnt", e))
    };
    let own = own_mnt()?;
    if container.inside {
        return if own == container.mnt {
            Ok(Entered { host: None })
        } else {
            Err(changed())
        };
    }
    if own == container.mnt {
        return Err(HookError::Unsupported(
            "the container shares the host's mount namespace; tessera-hook will not inject devices into it".into(),
        ));
    }
    let host = me
        .open_link("ns/mnt", OFlags::RDONLY)
        .map_err(|e| err("opening /proc/self/ns/mnt", e))?;
    let target = container
        .proc
        .open_link("ns/mnt", OFlags::RDONLY)
        .map_err(|e| err("opening the init's mount namespace", e))?;
    let target_ns = fstat(&target).map_err(|e| err("fstat of the init's mount namespace", e))?;
    if NsId::from_stat(&target_ns) != container.mnt {
        return Err(changed());
    }
    rustix::thread::move_into_link_name_space(target.as_fd(), Some(LinkNameSpaceType::Mount))
        .map_err(|e| err("entering the container's mount namespace", e.into()))?;
    let entered = Entered { host: Some(host) };
    if own_mnt()? != container.mnt {
        entered.leave()?;
        return Err(HookError::Refused(
            "after setns the hook is not in the container's mount namespace; nothing was injected"
                .into(),
        ));
    }
    Ok(entered)
}

impl Entered {
    /// Returns to the host's mount namespace (if it was left).
    pub fn leave(self) -> Result<()> {
        if let Some(host) = self.host {
            rustix::thread::move_into_link_name_space(host.as_fd(), Some(LinkNameSpaceType::Mount))
                .map_err(|e| HookError::apply("returning to the host's mount namespace", e))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::exit;
    use crate::oci::parse_config;

    fn bundle_with(config: &str) -> (tempfile::TempDir, Bundle, OciConfig) {
        let t = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(t.path().join("rootfs")).expect("rootfs");
        let bundle = Bundle::open(t.path().to_str().expect("utf-8")).expect("bundle");
        let oci = parse_config(config.as_bytes()).expect("config.json");
        (t, bundle, oci)
    }

    /// The mount namespace the tests run in.
    fn own_mnt(procfs: &Procfs) -> NsId {
        procfs
            .process("self")
            .and_then(|p| p.ns_id("mnt"))
            .expect("ns")
    }

    /// The hook's own process as a (wrongly) located container.
    fn own_process(procfs: &Procfs, inside: bool, mnt: NsId) -> Container {
        Container {
            init_pid: std::process::id(),
            inside,
            mnt,
            proc: procfs.process("self").expect("self"),
            cgroups: Vec::new(),
            cgroups_absolute: true,
        }
    }

    #[test]
    fn expected_follows_the_config_namespaces_and_mounts() {
        let (t, bundle, oci) = bundle_with(
            r#"{"root": {"path": "rootfs"},
                "mounts": [{"destination": "/proc"}, {"destination": "/"}, {"destination": "dev"},
                           {"destination": "/usr/local/tessera/vgpu.json"}],
                "linux": {"namespaces": [{"type": "pid"}, {"type": "mount", "path": "/proc/self/ns/mnt"}],
                          "cgroupsPath": "/kubepods/pod1/c1"}}"#,
        );
        let e = expected(&bundle, &oci).expect("expected");
        let procfs = Procfs::open().expect("/proc");
        assert_eq!(e.pid, NsRequest::New);
        assert_eq!(e.mount, NsRequest::Join(own_mnt(&procfs)));
        let rootfs = std::fs::canonicalize(t.path().join("rootfs")).expect("canonical");
        assert_eq!(e.rootfs, rootfs.to_str().expect("utf-8"));
        assert_eq!(
            e.mounts_under_rootfs,
            [
                format!("{}/proc", e.rootfs),
                format!("{}/usr/local/tessera/vgpu.json", e.rootfs)
            ],
            "`/` and relative destinations are no evidence"
        );
        assert_eq!(e.cgroups_path.as_deref(), Some("/kubepods/pod1/c1"));
        let (_t, bundle, oci) = bundle_with(r#"{"root": {"path": "rootfs"}}"#);
        let shared = expected(&bundle, &oci).expect("expected");
        assert_eq!(
            (shared.mount, shared.pid),
            (NsRequest::Shared, NsRequest::Shared)
        );
    }

    #[test]
    fn a_namespace_path_that_cannot_be_read_is_malformed_input() {
        let (_t, bundle, oci) = bundle_with(
            r#"{"root": {"path": "rootfs"},
                "linux": {"namespaces": [{"type": "pid", "path": "/nonexistent/ns/pid"}]}}"#,
        );
        let e = expected(&bundle, &oci).expect_err("no such namespace");
        assert_eq!(e.exit_code(), exit::INPUT);
        assert!(
            e.to_string()
                .contains("linux.namespaces pid path /nonexistent/ns/pid"),
            "{e}"
        );
        let (_t, bundle, oci) = bundle_with("{}");
        let e = expected(&bundle, &oci).expect_err("no root.path");
        assert_eq!(e.exit_code(), exit::UNSUPPORTED);
    }

    #[test]
    fn a_container_sharing_the_hooks_mount_namespace_is_never_entered() {
        let procfs = Procfs::open().expect("/proc");
        let own = own_mnt(&procfs);
        let e = enter(&procfs, &own_process(&procfs, false, own)).expect_err("shared");
        assert_eq!(e.exit_code(), exit::UNSUPPORTED);
        assert!(
            e.to_string().contains("shares the host's mount namespace"),
            "{e}"
        );
    }

    #[test]
    fn inside_the_container_the_hook_stays_only_where_the_proof_saw_it() {
        let procfs = Procfs::open().expect("/proc");
        let own = own_mnt(&procfs);
        let entered = enter(&procfs, &own_process(&procfs, true, own)).expect("already there");
        entered.leave().expect("nothing to leave");
        let e = enter(&procfs, &own_process(&procfs, true, NsId::fake(1)))
            .expect_err("another namespace");
        assert_eq!(e.exit_code(), exit::REFUSED);
        assert!(e.to_string().contains("changed while the hook ran"), "{e}");
    }

    #[test]
    fn ancestors_walk_up_from_the_runtime_to_pid_1() {
        let procfs = Procfs::open().expect("/proc");
        let me = facts_of(&procfs.process("self").expect("self")).expect("facts");
        assert_eq!(me.pid, std::process::id());
        let chain = ancestors(&procfs, &me);
        assert_eq!(chain.first(), Some(&me.pid));
        assert_eq!(chain.get(1), Some(&me.ppid));
        assert!(chain.len() <= MAX_ANCESTORS);
        let mut unique = chain.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), chain.len(), "no pid twice: {chain:?}");
    }

    #[test]
    fn an_unpivoted_root_must_be_the_runtimes_rootfs_mount() {
        let procfs = Procfs::open().expect("/proc");
        let own = own_mnt(&procfs);
        let container = own_process(&procfs, false, own);
        let probe = RootProbe::take(&container).expect("probe");
        assert!(!probe.pivoted, "the test process shares the hook's root");
        let t = tempfile::tempdir().expect("tempdir");
        let e = probe
            .open(&container, t.path().to_str(), &procfs)
            .expect_err("a plain directory is no rootfs mount");
        assert_eq!(e.exit_code(), exit::UNSUPPORTED);
        assert!(
            e.to_string()
                .contains("is not a mount in the container's mount namespace"),
            "{e}"
        );
        let probe = RootProbe::take(&container).expect("probe");
        let e = probe
            .open(&container, None, &procfs)
            .expect_err("no root.path");
        assert_eq!(e.exit_code(), exit::UNSUPPORTED);
    }
}
