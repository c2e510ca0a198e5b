//! Which process is the container's init: the rules, over facts read from
//! `/proc` and `config.json` ([`crate::ns`] reads them). Pure, so every
//! pid-namespace arrangement and hook stage is tested without a runtime.
//!
//! The OCI state's `pid` is not a host pid in general. Seen with runc 1.1 and
//! crun 1.8 (the facts these rules rest on):
//!
//! | stage | hook runs in | state `pid` | hook's parent | init's parent |
//! |---|---|---|---|---|
//! | `prestart`, `createRuntime` | the runtime's namespaces | init's host pid | the runtime | the runtime (runc), or the runtime's parent (crun: `CLONE_PARENT`) |
//! | `createContainer`, own pid ns | the container's mount and pid ns, host `/proc` | 1 (runc), 0 (crun) | the init | as above |
//! | `createContainer`, pod-shared pid ns | same | the init's pid **in the shared ns**, e.g. 7 (runc), 0 (crun) | the init | as above |
//! | `createContainer`, host pid ns | the container's mount ns, host pid ns | init's host pid (runc), 0 (crun) | the init | as above |
//!
//! So a pid is never taken on trust. The candidate is the hook's parent when
//! the hook runs in a pid namespace below `/proc`'s (its pid in that namespace
//! must be the state's, when the state gives one), else the state's pid. It is
//! the container's init only when all of these hold:
//!
//! 1. **Lineage**: in the hook's mount namespace it is the hook's parent (the
//!    init runs `createContainer` hooks itself); in another mount namespace
//!    its parent is the runtime running the hook or one of the runtime's
//!    ancestors: crun starts the init with `CLONE_PARENT`, and where it joins
//!    a pid namespace the init is orphaned to the nearest subreaper above the
//!    runtime (containerd's shim, conmon) or to pid 1.
//! 2. **Namespaces as `config.json` asks**: mount and pid namespaces new
//!    (different from the runtime's; a new pid namespace's init is pid 1 in
//!    it), joined (the same as the `path` names), or shared with the runtime.
//! 3. **Root**: its mount namespace has a mount on the bundle's rootfs *and*
//!    one of `config.json`'s mounts under it — the mounts the runtime just made
//!    for this container, which the host's namespace never has.
//! 4. **Cgroup**: its cgroup is the one `linux.cgroupsPath` names (cgroupfs
//!    path, or systemd's `slice:prefix:name`), where the config names one and
//!    the hook sees cgroup paths from the runtime's cgroup namespace.
//!
//! Anything else is refused with one line naming the failed proof.

use crate::procfs::{CgroupEntry, MountInfo, NsId};

/// What `/proc` says about one process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcFacts {
    /// Its pid as `/proc` numbers it (the runtime's pid namespace).
    pub pid: u32,
    /// Its parent's pid, numbered the same way.
    pub ppid: u32,
    /// `NSpid`: its pid in each pid namespace from `/proc`'s down to its own.
    pub nspid: Vec<u32>,
    /// Its mount namespace.
    pub mnt: NsId,
    /// Its pid namespace.
    pub pid_ns: NsId,
}

impl ProcFacts {
    /// Whether it lives in a pid namespace below `/proc`'s.
    pub fn in_child_pid_ns(&self) -> bool {
        self.nspid.len() > 1
    }

    /// Its pid in its own pid namespace.
    pub fn inner_pid(&self) -> Option<u32> {
        self.nspid.last().copied()
    }
}

/// What `config.json` asks for one namespace kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NsRequest {
    /// Not listed: the container shares the runtime's.
    Shared,
    /// Listed without a path: a new one.
    New,
    /// Listed with a path: that one (its identity, as the hook stat'ed it).
    Join(NsId),
}

/// What the container must look like, from `config.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    /// The mount namespace request.
    pub mount: NsRequest,
    /// The pid namespace request.
    pub pid: NsRequest,
    /// The bundle's rootfs, canonical host path.
    pub rootfs: String,
    /// Mount destinations of `config.json`, as host paths under `rootfs`.
    pub mounts_under_rootfs: Vec<String>,
    /// `linux.cgroupsPath`, if set.
    pub cgroups_path: Option<String>,
}

/// Everything read about the candidate besides its [`ProcFacts`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CandidateView {
    /// Its process facts.
    pub facts: ProcFacts,
    /// Its mount table (`/proc/<pid>/mountinfo`).
    pub mounts: Vec<MountInfo>,
    /// Its cgroups (`/proc/<pid>/cgroup`).
    pub cgroups: Vec<CgroupEntry>,
    /// Whether the cgroup paths are seen from the runtime's cgroup namespace
    /// (false: from the container's own, where every path reads `/`).
    pub cgroups_absolute: bool,
}

/// The proven init.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proven {
    /// The init's pid as `/proc` numbers it.
    pub init_pid: u32,
    /// Whether the hook runs in the container's mount namespace.
    pub inside: bool,
}

/// Why a process could not be proven to be the container's init.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotProven {
    /// The evidence contradicts the state's pid or the candidate (exit 4).
    #[error("{0}")]
    Refused(String),
    /// The container is set up in a way the hook does not serve (exit 5).
    #[error("{0}")]
    Unsupported(String),
}

/// Picks the process to examine: the hook's parent when the hook runs in a
/// pid namespace below `/proc`'s, else the state's pid (the parent when the
/// state has none, as crun's `createContainer` state).
pub fn candidate(
    hook: &ProcFacts,
    parent: &ProcFacts,
    state_pid: Option<u32>,
) -> Result<u32, NotProven> {
    if !hook.in_child_pid_ns() {
        return Ok(state_pid.unwrap_or(parent.pid));
    }
    if parent.pid_ns != hook.pid_ns {
        return Err(NotProven::Refused(format!(
            "tessera-hook runs in a container's pid namespace, but its parent (pid {}) is not in it; cannot tell which container it serves",
            parent.pid
        )));
    }
    if let Some(pid) = state_pid
        && parent.inner_pid() != Some(pid)
    {
        return Err(NotProven::Refused(format!(
            "the OCI state names pid {pid} in the container's pid namespace, but the process running the hook (host pid {}) is pid {} there; refusing to guess the container's init",
            parent.pid,
            parent.inner_pid().unwrap_or(0)
        )));
    }
    Ok(parent.pid)
}

/// Proves that `cand` is the container's init, or says which proof failed.
/// `ancestors` are the pids from the hook's parent up to pid 1 (the runtime
/// and the processes above it); only a host-side hook needs them.
pub fn prove(
    hook: &ProcFacts,
    parent: &ProcFacts,
    ancestors: &[u32],
    cand: &CandidateView,
    expected: &Expected,
) -> Result<Proven, NotProven> {
    let c = &cand.facts;
    let refused = |why: String| {
        Err(NotProven::Refused(format!(
            "pid {} is not this container's init: {why}",
            c.pid
        )))
    };
    let inside = c.mnt == hook.mnt;

    // 1. Lineage.
    if inside && c.pid != parent.pid {
        return refused(format!(
            "it shares the hook's mount namespace but did not start the hook (the hook's parent is pid {})",
            parent.pid
        ));
    }
    if !inside && c.ppid != parent.pid && !ancestors.contains(&c.ppid) {
        return refused(format!(
            "its parent, pid {}, is neither the runtime running this hook (pid {}) nor above it",
            c.ppid, parent.pid
        ));
    }

    // 2. Namespaces as config.json asks.
    match expected.mount {
        NsRequest::Shared => {
            return Err(NotProven::Unsupported(
                "config.json asks for no mount namespace: the container shares the runtime's, and tessera-hook does not act on it".into(),
            ));
        }
        NsRequest::Join(ns) if c.mnt != ns => {
            return refused("its mount namespace is not the one config.json names".into());
        }
        _ => {}
    }
    match expected.pid {
        NsRequest::Shared if c.pid_ns != hook.pid_ns || hook.in_child_pid_ns() => {
            return refused(
                "config.json shares the runtime's pid namespace, and it is in another one".into(),
            );
        }
        NsRequest::New if inside && !hook.in_child_pid_ns() => {
            return refused(
                "config.json asks for a new pid namespace, and the hook runs in the runtime's"
                    .into(),
            );
        }
        NsRequest::New if !inside && c.pid_ns == hook.pid_ns => {
            return refused(
                "config.json asks for a new pid namespace, and it is in the runtime's".into(),
            );
        }
        NsRequest::New if c.inner_pid() != Some(1) => {
            return refused(format!(
                "config.json asks for a new pid namespace, whose init is pid 1 there, and it is pid {}",
                c.inner_pid().unwrap_or(0)
            ));
        }
        NsRequest::Join(ns) if c.pid_ns != ns => {
            return refused("its pid namespace is not the one config.json names".into());
        }
        _ => {}
    }

    // 3. Root: the runtime's mounts for this container.
    let mounted = |path: &str| cand.mounts.iter().any(|m| m.mount_point == path);
    if !mounted(&expected.rootfs) {
        return refused(format!(
            "its mount namespace has no mount on the rootfs {}",
            expected.rootfs
        ));
    }
    if !expected.mounts_under_rootfs.is_empty()
        && !expected.mounts_under_rootfs.iter().any(|p| mounted(p))
    {
        return refused(format!(
            "its mount namespace has none of config.json's mounts under {} (e.g. {})",
            expected.rootfs, expected.mounts_under_rootfs[0]
        ));
    }

    // 4. Cgroup.
    if let Some(wanted) = &expected.cgroups_path
        && cand.cgroups_absolute
        && !cand.cgroups.iter().any(|e| cgroup_matches(&e.path, wanted))
    {
        return refused(format!(
            "none of its cgroups is linux.cgroupsPath {wanted:?} ({})",
            cand.cgroups
                .iter()
                .map(|e| e.path.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }

    Ok(Proven {
        init_pid: c.pid,
        inside,
    })
}

/// Whether the cgroup `path` (as `/proc/<pid>/cgroup` shows it) is the one
/// `cgroups_path` names: a cgroupfs path (the runtime may nest it under its
/// own cgroup, so a suffix match on whole components), or systemd's
/// `slice:prefix:name`, whose unit is `prefix-name.scope` (or `name` when it
/// is a slice).
pub fn cgroup_matches(path: &str, cgroups_path: &str) -> bool {
    let components = |p: &str| -> Vec<String> {
        p.split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .map(str::to_owned)
            .collect()
    };
    let have = components(path);
    let want: Vec<String> = match cgroups_path.split(':').collect::<Vec<_>>().as_slice() {
        [_slice, prefix, name] if !cgroups_path.starts_with('/') => {
            let unit = if name.ends_with(".slice") {
                (*name).to_owned()
            } else if prefix.is_empty() {
                format!("{name}.scope")
            } else {
                format!("{prefix}-{name}.scope")
            };
            vec![unit]
        }
        _ => components(cgroups_path),
    };
    !want.is_empty() && have.ends_with(&want)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOST_MNT: u64 = 100;
    const HOST_PID: u64 = 200;
    const CTR_MNT: u64 = 101;
    const CTR_PID: u64 = 201;
    const POD_PID: u64 = 202;
    const ROOTFS: &str = "/run/b/rootfs";

    fn facts(pid: u32, ppid: u32, nspid: &[u32], mnt: u64, pid_ns: u64) -> ProcFacts {
        ProcFacts {
            pid,
            ppid,
            nspid: nspid.to_vec(),
            mnt: NsId::fake(mnt),
            pid_ns: NsId::fake(pid_ns),
        }
    }

    fn mount(id: u64, at: &str) -> MountInfo {
        MountInfo {
            id,
            root: "/".into(),
            mount_point: at.into(),
            optional: vec![],
            fstype: "ext4".into(),
            super_options: vec![],
        }
    }

    fn container_mounts() -> Vec<MountInfo> {
        vec![
            mount(1, "/"),
            mount(70, ROOTFS),
            mount(71, &format!("{ROOTFS}/proc")),
        ]
    }

    fn cgroups(path: &str) -> Vec<CgroupEntry> {
        vec![CgroupEntry {
            hierarchy: 4,
            controllers: vec!["memory".into()],
            path: path.into(),
        }]
    }

    fn expected(pid: NsRequest) -> Expected {
        Expected {
            mount: NsRequest::New,
            pid,
            rootfs: ROOTFS.into(),
            mounts_under_rootfs: vec![format!("{ROOTFS}/proc"), format!("{ROOTFS}/dev")],
            cgroups_path: Some("/kubepods/pod1/ctr1".into()),
        }
    }

    fn view(facts: ProcFacts) -> CandidateView {
        CandidateView {
            facts,
            mounts: container_mounts(),
            cgroups: cgroups("/kubepods/pod1/ctr1"),
            cgroups_absolute: true,
        }
    }

    /// The processes of one arrangement: the runtime (pid 50, its parent 40),
    /// the init (pid 60, its host facts), and the hook at one stage.
    struct Arrangement {
        runtime: ProcFacts,
        init: ProcFacts,
        request: NsRequest,
    }

    /// `pid_mode`: `own`, `pod` (the init is pid 7 in a shared namespace) or `host`.
    /// `init_parent`: 50 (runc: the runtime) or 40 (crun: the runtime's parent).
    fn arrangement(pid_mode: &str, init_parent: u32) -> Arrangement {
        let runtime = facts(50, 40, &[50], HOST_MNT, HOST_PID);
        let (init, request) = match pid_mode {
            "own" => (
                facts(60, init_parent, &[60, 1], CTR_MNT, CTR_PID),
                NsRequest::New,
            ),
            "pod" => (
                facts(60, init_parent, &[60, 7], CTR_MNT, POD_PID),
                NsRequest::Join(NsId::fake(POD_PID)),
            ),
            _ => (
                facts(60, init_parent, &[60], CTR_MNT, HOST_PID),
                NsRequest::Shared,
            ),
        };
        Arrangement {
            runtime,
            init,
            request,
        }
    }

    impl Arrangement {
        /// The hook at a host-side stage (prestart, createRuntime).
        fn outside_hook(&self) -> ProcFacts {
            facts(70, 50, &[70], HOST_MNT, HOST_PID)
        }

        /// The hook at createContainer: a child of the init in its namespaces.
        fn inside_hook(&self) -> ProcFacts {
            let mut nspid = vec![70];
            if self.init.in_child_pid_ns() {
                nspid.push(9);
            }
            ProcFacts {
                pid: 70,
                ppid: 60,
                nspid,
                mnt: self.init.mnt,
                pid_ns: self.init.pid_ns,
            }
        }

        fn identify(
            &self,
            hook: &ProcFacts,
            state_pid: Option<u32>,
            lookup: &dyn Fn(u32) -> Option<ProcFacts>,
        ) -> Result<Proven, NotProven> {
            let parent = lookup(hook.ppid).expect("the hook's parent exists");
            let pid = candidate(hook, &parent, state_pid)?;
            let cand = lookup(pid).ok_or_else(|| NotProven::Refused("no such pid".into()))?;
            // Only the init's namespace has the runtime's mounts and the cgroup.
            let seen = if pid == self.init.pid {
                view(cand)
            } else {
                CandidateView {
                    facts: cand,
                    mounts: vec![mount(1, "/"), mount(2, "/proc")],
                    cgroups: cgroups("/system.slice/some.service"),
                    cgroups_absolute: true,
                }
            };
            prove(hook, &parent, &[50, 40, 1], &seen, &expected(self.request))
        }

        fn lookup(&self) -> impl Fn(u32) -> Option<ProcFacts> + '_ {
            move |pid| match pid {
                50 => Some(self.runtime.clone()),
                60 => Some(self.init.clone()),
                // A host kernel thread, and a host daemon with its own mount namespace.
                7 => Some(facts(7, 2, &[7], HOST_MNT, HOST_PID)),
                900 => Some(facts(900, 40, &[900], 150, HOST_PID)),
                _ => None,
            }
        }
    }

    /// `prove` for a host-side hook of the `own` arrangement under runc: the
    /// runtime is pid 50, above it 40 and 1.
    fn prove_at_prestart(cand: &CandidateView, exp: &Expected) -> Result<Proven, NotProven> {
        let a = arrangement("own", 50);
        prove(&a.outside_hook(), &a.runtime, &[50, 40, 1], cand, exp)
    }

    /// The state pid each runtime gives at createContainer for each pid mode.
    fn inside_state_pid(pid_mode: &str, crun: bool) -> Option<u32> {
        match (crun, pid_mode) {
            (true, _) => None,
            (false, "own") => Some(1),
            (false, "pod") => Some(7),
            (false, _) => Some(60),
        }
    }

    #[test]
    fn every_pid_mode_at_every_stage_under_both_runtimes_finds_the_init() {
        for pid_mode in ["own", "pod", "host"] {
            // runc: the runtime; crun: its parent (CLONE_PARENT), or pid 1
            // when the init was orphaned joining a pid namespace.
            for (crun, init_parent) in [(false, 50), (true, 40), (true, 1)] {
                let a = arrangement(pid_mode, init_parent);
                let outside = a.identify(&a.outside_hook(), Some(60), &a.lookup());
                assert_eq!(
                    outside,
                    Ok(Proven {
                        init_pid: 60,
                        inside: false
                    }),
                    "prestart, {pid_mode}, crun={crun}"
                );
                let inside = a.identify(
                    &a.inside_hook(),
                    inside_state_pid(pid_mode, crun),
                    &a.lookup(),
                );
                assert_eq!(
                    inside,
                    Ok(Proven {
                        init_pid: 60,
                        inside: true
                    }),
                    "createContainer, {pid_mode}, crun={crun}"
                );
            }
        }
    }

    #[test]
    fn an_init_started_by_no_ancestor_of_the_runtime_is_refused() {
        let a = arrangement("own", 77);
        let got = a.identify(&a.outside_hook(), Some(60), &a.lookup());
        let err = got.expect_err("refused");
        assert!(err.to_string().contains("its parent, pid 77"), "{err}");
    }

    #[test]
    fn a_namespace_pid_is_never_taken_for_a_host_pid() {
        // The reported defect: pid 7 in the pod's namespace is a host kernel thread.
        let a = arrangement("pod", 50);
        let hook = a.inside_hook();
        let parent = a.init.clone();
        assert_eq!(candidate(&hook, &parent, Some(7)), Ok(60));
        // A state pid that is not the hook's parent's pid in the namespace.
        let err = candidate(&hook, &parent, Some(8)).expect_err("mismatch");
        assert!(err.to_string().contains("pid 8"), "{err}");
    }

    #[test]
    fn forged_state_pids_at_prestart_are_refused() {
        for pid_mode in ["own", "pod", "host"] {
            let a = arrangement(pid_mode, 50);
            for forged in [7, 900, 50] {
                let got = a.identify(&a.outside_hook(), Some(forged), &a.lookup());
                assert!(
                    matches!(got, Err(NotProven::Refused(_))),
                    "{pid_mode}: state pid {forged} gave {got:?}"
                );
            }
        }
    }

    #[test]
    fn another_container_of_the_same_runtime_parent_is_refused_by_its_mounts() {
        // Another container's init, also a child of pid 40, pivoted long ago:
        // its mount table holds no mount on this bundle's rootfs.
        let other = CandidateView {
            facts: facts(61, 40, &[61, 1], 102, 203),
            mounts: vec![mount(1, "/"), mount(2, "/proc")],
            cgroups: cgroups("/kubepods/pod1/ctr1"),
            cgroups_absolute: true,
        };
        let err = prove_at_prestart(&other, &expected(NsRequest::New)).expect_err("refused");
        assert!(err.to_string().contains("no mount on the rootfs"), "{err}");
    }

    #[test]
    fn the_host_mount_namespace_is_refused_at_every_stage() {
        // The runtime's own pid named by the state: it shares the hook's mount
        // namespace and is its parent, but the host has no container mounts.
        let a = arrangement("host", 50);
        let mut runtime_view = view(a.runtime.clone());
        runtime_view.mounts = vec![mount(1, "/"), mount(70, ROOTFS)];
        let err = prove_at_prestart(&runtime_view, &expected(NsRequest::Shared))
            .expect_err("the host is no container");
        assert!(
            err.to_string().contains("none of config.json's mounts"),
            "{err}"
        );
    }

    #[test]
    fn namespace_requests_are_checked() {
        let a = arrangement("own", 50);
        let init = view(a.init.clone());
        let mut exp = expected(NsRequest::New);
        exp.mount = NsRequest::Shared;
        assert!(matches!(
            prove_at_prestart(&init, &exp),
            Err(NotProven::Unsupported(_))
        ));
        exp.mount = NsRequest::Join(NsId::fake(999));
        assert!(prove_at_prestart(&init, &exp).is_err());
        // The init asked to join pod namespace 202 lives in 201.
        let exp = expected(NsRequest::Join(NsId::fake(POD_PID)));
        assert!(prove_at_prestart(&init, &exp).is_err());
        // A new pid namespace's init is pid 1 in it.
        let mut not_one = init.clone();
        not_one.facts.nspid = vec![60, 3];
        assert!(prove_at_prestart(&not_one, &expected(NsRequest::New)).is_err());
        // hostPID asked for, but the init has its own.
        assert!(prove_at_prestart(&init, &expected(NsRequest::Shared)).is_err());
    }

    #[test]
    fn cgroups_path_must_match_when_seen_absolutely() {
        let a = arrangement("own", 50);
        let mut init = view(a.init.clone());
        init.cgroups = cgroups("/kubepods/pod1/other");
        let err = prove_at_prestart(&init, &expected(NsRequest::New)).expect_err("cgroup");
        assert!(err.to_string().contains("cgroupsPath"), "{err}");
        // From inside a cgroup namespace every path reads "/": not evidence.
        init.cgroups = cgroups("/");
        init.cgroups_absolute = false;
        assert!(prove_at_prestart(&init, &expected(NsRequest::New)).is_ok());
    }

    #[test]
    fn cgroup_paths_in_both_driver_forms() {
        assert!(cgroup_matches("/kubepods/pod1/abc", "/kubepods/pod1/abc"));
        // Nested under the runtime's own cgroup.
        assert!(cgroup_matches(
            "/process_api/x/kubepods/abc",
            "/kubepods/abc"
        ));
        assert!(cgroup_matches("/a/b", "a/b"));
        assert!(!cgroup_matches("/kubepods/pod1/abcd", "/kubepods/pod1/abc"));
        assert!(!cgroup_matches("/", "/kubepods/abc"));
        assert!(cgroup_matches(
            "/kubepods.slice/kubepods-pod1.slice/cri-containerd-abc.scope",
            "kubepods-pod1.slice:cri-containerd:abc"
        ));
        assert!(cgroup_matches(
            "/system.slice/docker-abc.scope",
            "system.slice:docker:abc"
        ));
        assert!(cgroup_matches(
            "/machine.slice/my.slice",
            "machine.slice::my.slice"
        ));
        assert!(!cgroup_matches(
            "/system.slice/docker-abd.scope",
            "system.slice:docker:abc"
        ));
        assert!(!cgroup_matches("/x", "/"));
    }
}
